"""The speed sweep: KV configurations x seeds x user counts, with the KV pool held fixed.

For each seed and configuration a fresh vLLM server starts, in ``spec.runs()`` order (ABBA by
default, so drift cannot masquerade as an effect); for each user count vLLM's benchmark client runs
against it while a background sampler records the clock.

One folder per sweep::

    manifest.json             the grid, how/when/where it was captured, versions, cell states
    runs/<run>.json           resolved-run record of each server start (or why it failed)
    logs/<run>.server.log     the server's log;  logs/<cell>.bench.log  the client's output
    cells/<cell>.json         per-cell result: status, metrics, median clock, reason, log tail
    bench/<cell>.json         vLLM's saved result JSON (with its per-request arrays)
    requests/<cell>.jsonl     per-request records
    telemetry/<cell>.jsonl    clock samples

The loop, resumption and done rule are the grid engine's (``kvstudy.bench.grid.run_grid``); this
module supplies how one cell runs and its result record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvstudy.bench import grid
from kvstudy.bench.client import MEASURED_RUN_MARKER, BenchError
from kvstudy.bench.result import calculate_metrics, metrics_reported_by_vllm
from kvstudy.bench.spec import RUN_ORDERS, Cell, Run
from kvstudy.bench.telemetry import (
    WINDOW_START,
    TelemetrySampler,
    default_reader,
    median_clock,
    scrape_server_metrics,
    window_clocks,
)
from kvstudy.capture import now_utc
from kvstudy.io import log_tail
from kvstudy.progress import Progress
from kvstudy.speed.spec import SpeedCellResult, SweepSpec

KIND = "kvstudy speed sweep"
load_spec = partial(grid.load_spec, SweepSpec, KIND)


def prepare_capture(spec: SweepSpec, capture: Path, how: str = "") -> dict[str, Any]:
    """Create the folder and manifest, or check an existing one holds the same grid and model."""
    run_order = {
        "rule": spec.run_order,
        "meaning": RUN_ORDERS[spec.run_order],
        "server_starts": [r.id for r in spec.runs()],
    }
    return grid.prepare_capture(
        spec, capture, KIND, how or "kvstudy.speed.runner.run_sweep", lambda: {"run_order": run_order}
    )


# --------------------------------------------------------------------------- running


def _failed(
    spec: SweepSpec, cell: Cell, reason: str, log_tail: str, started: str = "", seconds: float = 0.0
) -> SpeedCellResult:
    return SpeedCellResult(
        **spec.identity(cell),
        status="failed",
        reason=spec.scrub()(reason),
        log_tail=spec.scrub()(log_tail),
        settings=asdict(spec.bench_settings(cell)),
        started_utc=started or now_utc(),
        seconds=seconds,
    )


def run_cell(spec: SweepSpec, capture: Path, cell: Cell, server: Any, tokenizer: str | None) -> SpeedCellResult:
    """Run one cell against a ready server and write its files; never raises for a bench failure."""
    settings = spec.bench_settings(cell)
    started, t0, wall0 = now_utc(), time.perf_counter(), time.time()
    sampler = TelemetrySampler(default_reader(), spec.telemetry_interval_s)
    before = scrape_server_metrics(server.base_url) if spec.scrape_metrics else None

    def on_line(line: str) -> None:  # the client announces its measured requests: an edge sample
        if MEASURED_RUN_MARKER in line:
            sampler.mark(WINDOW_START)

    try:
        result, records = grid.bench_cell(
            capture, cell.id, settings, server, tokenizer, spec.bench_timeout_s, sampler, on_line
        )
    except BenchError as exc:
        alive = server.is_alive()
        reason = str(exc) + ("" if alive else " (the server is no longer running)")
        tail = exc.log_tail if alive else log_tail(server.log_path) + "\n--- client ---\n" + exc.log_tail
        return _stamp(_failed(spec, cell, reason, tail, started, time.perf_counter() - t0), spec, t0, wall0)
    metrics = calculate_metrics(records, float(result.get("duration") or 0) or 1e-9)
    # the measured requests' span: first start and last end of the successful ones (None without their starts)
    ok = [r for r in records if r.success]
    starts = [r.start_time_s for r in ok if r.start_time_s is not None]
    ends = [r.end_time_s for r in ok if r.end_time_s is not None]
    window = (min(starts), max(ends)) if ok and len(starts) == len(ok) else None
    # the clock median's span: from the edge sample taken when the client announced its measured requests
    # to the one taken when it exited (it contains every measured request); when the client printed no
    # announcement, the span of the measured requests themselves
    edges = sampler.window()
    clock_window = edges if edges is not None and (window is None or edges[0] <= window[0]) else window
    clock = median_clock(sampler.samples, *clock_window) if clock_window else None
    res = SpeedCellResult(
        **spec.identity(cell),
        status="ok",
        metrics=asdict(metrics),
        vllm_metrics=metrics_reported_by_vllm(result),
        median_clock_mhz=clock,
        clock_device=sampler.samples[0].device if sampler.samples else None,
        bench_window_s=window,
        settings=asdict(settings),
        started_utc=started,
        seconds=time.perf_counter() - t0,
        clock_window_s=clock_window,
        clock_samples_in_window=len(window_clocks(sampler.samples, *clock_window)) if clock_window else 0,
        server_metrics_before=before,
        server_metrics_after=scrape_server_metrics(server.base_url) if spec.scrape_metrics else None,
    )
    _stamp(res, spec, t0, wall0)
    if metrics.failed:
        first = next(r.error for r in records if not r.success)
        last_line = next((ln.strip() for ln in reversed(first.splitlines()) if ln.strip()), "no error text")
        alive = "" if server.is_alive() else " (the server is no longer running)"
        res.status = "failed"
        res.reason = f"{metrics.failed} of {len(records)} requests failed{alive}; first error: {last_line[:300]}"
        res.log_tail = spec.scrub()(log_tail(server.log_path))
    return res


def _stamp(res: SpeedCellResult, spec: SweepSpec, t0_mono: float, t0_wall: float) -> SpeedCellResult:
    """Start/end on the monotonic clock (shared with the client's request times) and the wall clock,
    the sampling interval, and the cell's server start in the run order."""
    res.started_mono_s, res.ended_mono_s = t0_mono, time.perf_counter()
    res.started_wall_s, res.ended_wall_s = t0_wall, time.time()
    res.clock_interval_s = spec.telemetry_interval_s
    res.run_position = spec.runs().index(Run(res.configuration, res.seed))
    return res


def run_sweep(
    spec: SweepSpec,
    capture: str | Path,
    how: str = "",
    progress: Progress = print,
    on_cell_start: Callable[[Cell, Any], None] | None = None,
    retry_failed: bool = False,
) -> list[SpeedCellResult]:
    """Run every cell ``capture`` lacks (failed ones only with ``retry_failed``); the results of the
    cells run now. ``on_cell_start(cell, server)`` is called before each cell (tests inject faults)."""
    capture = Path(capture)
    manifest = prepare_capture(spec, capture, how)
    return grid.run_grid(spec, capture, manifest, run_cell, _failed, retry_failed, progress, on_cell_start)
