"""The model: its folder and config, KV bytes per token, the block allocator, weights, KV scales in the checkpoint."""
