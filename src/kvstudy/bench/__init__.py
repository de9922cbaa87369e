"""The bench layer every experiment shares: the one arm type, vLLM's benchmark client, its saved
result read once into per-request records, vLLM's metrics, the per-run measurability check, the
clock telemetry and the one sweep engine (``grid``) the speed and context sweeps run on."""
