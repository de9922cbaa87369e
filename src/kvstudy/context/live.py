"""A context-sweep capture analysed: per-arm fits, comparisons against the 16-bit arm, the roofline beside them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy import capture as capture_format
from kvstudy.bench.grid import CapturedCell, read_capture
from kvstudy.context.fit import (
    DEFAULT_BOOT,
    ArmComparison,
    CellCheck,
    LineFit,
    cells_from_records,
    compare_arms,
    fit_all,
)
from kvstudy.context.predict import SlopeRow, roofline_applies
from kvstudy.context.spec import ContextSweepSpec, default_arms
from kvstudy.context.sweep import KIND, load_context_spec, read_bandwidth
from kvstudy.errors import StudyError
from kvstudy.io import shorten_words
from kvstudy.model.capacity import kv_footprint
from kvstudy.model.layout import load_layout
from kvstudy.model.roofline import predicted_slope_ms_per_token
from kvstudy.vllm.facts import SIXTEEN_BIT


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
    records: tuple[CapturedCell, ...]  # the spec's cells that ran, in its order
    checks: tuple[CellCheck, ...]
    fits: dict[str, LineFit]
    comparisons: tuple[ArmComparison, ...]
    not_measured: dict[str, str]
    bandwidth: dict[str, Any] | None
    baseline: str | None


def analyse_capture(capture: str | Path, n_boot: int = DEFAULT_BOOT, seed: int = 0) -> ContextAnalysis:
    """Read, check and fit a capture made by ``kvstudy.context.sweep`` (complete or not)."""
    capture = Path(capture)
    grid = read_capture(capture, KIND, ("arm", "seed", "input_len"))
    spec = load_context_spec(capture, grid.manifest)
    records = tuple(grid.cells[c.id] for c in spec.cells() if c.id in grid.cells)
    cells, checks = cells_from_records(records)
    fits = fit_all(cells, n_boot, seed)
    not_measured = {}
    for a in spec.arms:
        if a.name in fits:
            continue
        starts = [r for r in grid.runs.values() if r.id.startswith(f"{a.name}__s")]
        if starts and all(r.status == "failed" for r in starts):
            not_measured[a.name] = f"every server start failed: {shorten_words(starts[0].reason, 240)}"
        elif not any(r.data.get("arm") == a.name for r in records):
            not_measured[a.name] = "no cells captured yet (the capture is incomplete: resume it)"
        else:
            reasons = sorted({c.reason for c in checks if c.cell_id.startswith(f"{a.name}__") and c.reason})
            not_measured[a.name] = shorten_words("; ".join(reasons), 240) or "fewer than two measured lengths"
    baseline = next((a.name for a in spec.arms if a.kv_cache_dtype in SIXTEEN_BIT), None)
    comparisons = []
    if baseline in fits:
        comparisons = [compare_arms(fits[baseline], fits[a]) for a in fits if a != baseline]
    return ContextAnalysis(
        str(capture),
        spec,
        records,
        tuple(checks),
        fits,
        tuple(comparisons),
        not_measured,
        read_bandwidth(capture),
        baseline,
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
            raise StudyError(f"{analysis.capture}/bandwidth.json: not found; pass a bandwidth in GB/s")
        bandwidth_gb_s = float(analysis.bandwidth["best_gb_s"])
    spec = analysis.spec
    layout = load_layout(str(capture_format.model_config(analysis.capture, spec.model)))
    machine = capture_format.read_manifest(analysis.capture).get("machine") or {}
    cache = machine.get("cpu_last_level_cache_bytes") if machine.get("device") == "cpu" else None
    longest = max(spec.lengths) + spec.output_len
    rows = []
    for arm in spec.arms:
        skip = "sliding_window" if "sliding_window" in arm.extra_args else None
        kv_longest = kv_footprint(layout, arm.kv_cache_dtype, longest, skip).bytes_per_request
        applies, why_not = roofline_applies(
            kv_longest, cache if isinstance(cache, int) and cache > 0 else None, "recorded at capture time", longest
        )
        fit = analysis.fits.get(arm.name)
        rows.append(
            SlopeRow(
                arm.name,
                arm.kv_cache_dtype,
                None if fit is None else fit.slope_ms_per_token,
                None if fit is None else fit.slope_ci,
                fit is not None and fit.resolved,
                fit is not None and fit.runs < 2,
                predicted_slope_ms_per_token(layout, arm.kv_cache_dtype, bandwidth_gb_s, 1.0, skip_layers=skip),
                bandwidth_gb_s,
                origin,
                kv_longest / 2**20,
                applies,
                why_not,
                analysis.not_measured.get(arm.name, "no measurable cells") if fit is None else "",
            )
        )
    return rows


def points_frame(analysis: ContextAnalysis) -> Any:
    """One row per cell: arm, seed, input length, mean TPOT, requests, measurable and why not."""
    import numpy as np
    import pandas as pd

    checks = {c.cell_id: c for c in analysis.checks}
    rows = []
    for rec in analysis.records:
        tpots = [r.tpot_ms for r in rec.requests if r.tpot_ms is not None]
        chk = checks[rec.id]
        rows.append(
            {
                "arm": rec.data["arm"],
                "seed": rec.data["seed"],
                "input_len": rec.data["input_len"],
                "mean_tpot_ms": float(np.mean(tpots)) if tpots else None,
                "requests": len(tpots),
                "measurable": chk.measurable,
                "why not": chk.reason,
            }
        )
    return pd.DataFrame(rows)


def plot_fits(analysis: ContextAnalysis, predicted: dict[str, float] | None = None) -> Any:
    """Mean TPOT per cell vs input length with each arm's fitted line and, dashed, the roofline's slope
    drawn through the fit's intercept (so the gap between the two slopes shows)."""
    import matplotlib.pyplot as plt
    import numpy as np

    frame = points_frame(analysis)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, arm in enumerate(dict.fromkeys(frame["arm"])):
        color = f"C{i}"
        mine = frame[(frame["arm"] == arm) & frame["measurable"]]
        if mine.empty:
            continue
        ax.scatter(mine["input_len"], mine["mean_tpot_ms"], color=color, s=18, label=f"{arm}: per seed (measured)")
        fit = analysis.fits.get(arm)
        if fit is None:
            continue
        xs = np.linspace(min(fit.lengths), max(fit.lengths), 50)
        ax.plot(xs, fit.intercept_ms + fit.slope_ms_per_token * xs, color=color, label=f"{arm}: fitted a + b·L")
        if predicted and arm in predicted:
            ax.plot(
                xs,
                fit.intercept_ms + predicted[arm] * (xs - xs[0]) + fit.slope_ms_per_token * xs[0],
                color=color,
                ls="--",
                label=f"{arm}: roofline slope (predicted)",
            )
    ax.set_xlabel("input length L (tokens)")
    ax.set_ylabel("TPOT (ms)")
    ax.legend(fontsize=7)
    ax.set_title("Decode time per token vs context, one user")
    return fig
