"""Load at equal KV memory: the 16-bit and the FP8 KV cache given the same KV bytes, a rising load,
and how many users each serves within a latency target (notebook 08)."""
