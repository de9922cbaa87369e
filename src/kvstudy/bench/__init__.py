"""The bench layer every experiment shares: vLLM's benchmark client, its saved result read once into
per-request records, vLLM's metrics, the per-run measurability check and the clock telemetry."""
