"""The model: its folder and config, KV bytes per token, the block allocator, weights, the decode-step roofline, KV scales in the checkpoint."""
