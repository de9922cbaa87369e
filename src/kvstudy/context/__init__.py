"""Context scaling: the published ITL slopes beside the roofline, the live sweep and its fits, and a memory-bandwidth probe."""
