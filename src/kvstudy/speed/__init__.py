"""The speed experiment: the sweep grid, vLLM's benchmark client, clock telemetry, the runner and the analysis."""
