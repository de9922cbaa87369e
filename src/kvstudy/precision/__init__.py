"""KV-cache precision: a paired log-probability screen of two servers, and simulated FP8 KV storage."""
