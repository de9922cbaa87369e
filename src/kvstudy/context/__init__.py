"""Context scaling: what a decode step reads (the roofline), the published ITL slopes, and a memory-bandwidth probe."""
