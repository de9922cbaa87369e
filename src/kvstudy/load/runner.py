"""The load experiment on the grid engine: arms x seeds (server starts, ABBA), each running the
offered-load ladder, every arm given the same KV bytes.

Beyond the sweep format (``kvstudy.bench.grid``) a capture holds ``telemetry/<cell>.metrics.jsonl``
(vLLM's /metrics during the cell). Each start's logged pool is checked against the prediction for
its dtype (:func:`pool_check`); a pool that disagrees fails every cell of that start.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvstudy.bench import grid
from kvstudy.bench.client import BenchError
from kvstudy.bench.result import calculate_metrics, metrics_reported_by_vllm
from kvstudy.bench.spec import Cell, Run
from kvstudy.bench.telemetry import ServerMetricsSampler, scrape_server_metrics
from kvstudy.capture import now_utc
from kvstudy.io import log_tail, read_text_checked
from kvstudy.load.spec import LoadCellResult, LoadSpec, arm_pools, check_design, check_knobs, pool_table
from kvstudy.model.allocator import predict_logged_pool
from kvstudy.progress import Progress
from kvstudy.vllm.facts import EQUAL_MEMORY_KNOB
from kvstudy.vllm.startup_log import parse_startup_text

KIND = "kvstudy load sweep"
load_spec = partial(grid.load_spec, LoadSpec, KIND)


def prepare_capture(spec: LoadSpec, capture: Path, how: str = "") -> dict[str, Any]:
    return grid.prepare_capture(
        spec,
        capture,
        KIND,
        how or "kvstudy.load.runner.run_load",
        lambda: {
            "run_order": {"rule": spec.run_order, "server_starts": [r.id for r in spec.runs()]},
            "equal_memory": {
                "knob": EQUAL_MEMORY_KNOB[spec.device],
                "pools": pool_table(spec),
                "ladder": spec.loads(),
                "requests_per_cell": "concurrency x rounds_per_cell",
            },
        },
    )


# --------------------------------------------------------------------------- the pool check


def pool_check(spec: LoadSpec, arm: str, log_text: str) -> dict[str, Any]:
    """The pool a start logged against the prediction for its arm's dtype and knob (vLLM's block rules):
    ``ok`` only when the logged ``KV cache size`` tokens equal the predicted ones."""
    pool = arm_pools(spec)[arm]
    config = spec.server_config(Run(arm, spec.seeds[0]))
    predicted = predict_logged_pool(
        spec.model,
        spec.arm(arm).kv_cache_dtype,
        spec.kv_memory_bytes,
        spec.model_len,
        pool.block_size,
        num_blocks_override=config.num_gpu_blocks_override,
        device=spec.device,
    )
    logged = parse_startup_text(log_text).pool_tokens
    reason = ""
    if logged is None:
        reason = "the server log holds no 'KV cache size' line"
    elif logged != predicted.tokens:
        reason = (
            f"the logged pool ({logged:,} tokens) disagrees with the prediction for "
            f"{spec.arm(arm).kv_cache_dtype} at {spec.kv_memory_bytes:,} bytes ({predicted.tokens:,} tokens)"
        )
    return {
        "predicted_tokens": predicted.tokens,
        "logged_tokens": logged,
        "predicted_blocks": predicted.num_blocks,
        "ok": not reason,
        "reason": reason,
    }


# --------------------------------------------------------------------------- one cell


def share_within(records: Iterable[Any], target: Mapping[str, float]) -> tuple[int, int]:
    """(requests within the target, requests) of a cell's per-request records, by vLLM's goodput rule:
    a request succeeded and met each limit in ``target`` (ms); one output token (no TPOT) counts as TPOT 0."""
    rows = [(r.success, {"ttft": r.ttft_ms, "tpot": r.tpot_ms or 0.0, "e2el": r.e2el_ms}) for r in records]
    return sum(ok and all(v[k] <= limit for k, limit in target.items()) for ok, v in rows), len(rows)


def _failed(spec: LoadSpec, cell: Cell, reason: str, tail: str, pool: dict[str, Any] | None = None) -> LoadCellResult:
    scrub = spec.scrub()
    return LoadCellResult(
        **spec.identity(cell),
        status="failed",
        reason=scrub(reason),
        log_tail=scrub(tail),
        pool=pool,
        settings=asdict(spec.bench_settings(cell)),
        started_utc=now_utc(),
    )


def run_cell(spec: LoadSpec, capture: Path, cell: Cell, server: Any, tokenizer: str | None) -> LoadCellResult:
    """One load step against a ready server: the pool check, vLLM's client with --goodput, /metrics
    sampled meanwhile; never raises for a bench failure."""
    pool = pool_check(spec, cell.arm, read_text_checked(server.log_path))
    if not pool["ok"]:
        return _failed(spec, cell, f"failed start: {pool['reason']}", log_tail(server.log_path), pool)
    settings = spec.bench_settings(cell)
    started, t0 = now_utc(), time.perf_counter()
    before = scrape_server_metrics(server.base_url)
    sampler = ServerMetricsSampler(server.base_url, spec.telemetry_interval_s)
    try:
        result, records = grid.bench_cell(capture, cell.id, settings, server, tokenizer, spec.bench_timeout_s, sampler)
    except BenchError as exc:
        res = _failed(spec, cell, str(exc), exc.log_tail, pool)
        res.seconds = time.perf_counter() - t0
        return res
    duration = float(result.get("duration") or 0) or 1e-9
    within, n = share_within(records, spec.target)
    res = LoadCellResult(
        **spec.identity(cell),
        status="ok",
        metrics=asdict(calculate_metrics(records, duration)),
        vllm_metrics={**metrics_reported_by_vllm(result), "request_goodput": result.get("request_goodput")},
        within_target=within,
        requests=n,
        share_within_target=within / n if n else None,
        goodput_req_s=within / duration,
        pool=pool,
        server_metrics_before=before,
        server_metrics_after=scrape_server_metrics(server.base_url),
        server_samples=len(sampler.samples),
        peak_running=sampler.peak("requests_running"),
        peak_waiting=sampler.peak("requests_waiting"),
        peak_kv_usage=sampler.peak("kv_cache_usage"),
        settings=asdict(settings),
        started_utc=started,
        seconds=time.perf_counter() - t0,
    )
    failed = [r for r in records if not r.success]
    if failed and not server.is_alive():
        res.status, res.reason = "failed", f"{len(failed)} of {n} requests failed (the server is no longer running)"
    return res


def run_load(
    spec: LoadSpec,
    capture: str | Path,
    how: str = "",
    progress: Progress = print,
    retry_failed: bool = False,
    on_cell_start: Any = None,
) -> list[LoadCellResult]:
    """Run every cell ``capture`` lacks (failed ones only with ``retry_failed``); refusals come first."""
    capture = Path(capture)
    if grid.cells_to_run(capture, spec.cells(), retry_failed):
        check_design(spec)
        check_knobs(spec)
    manifest = prepare_capture(spec, capture, how)
    return grid.run_grid(spec, capture, manifest, run_cell, _failed, retry_failed, progress, on_cell_start)
