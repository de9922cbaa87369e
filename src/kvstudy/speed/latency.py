"""Latency percentiles and speed over concurrency for notebook 02, from a capture's per-request rows.

Percentiles are computed from the pooled per-request rows (vLLM's per-run percentiles cannot be
pooled over seeds); a percentile q needs ``100 / (100 - q)`` samples to be resolved. An arm whose
cells failed, or whose per-token latency was not measurable, is marked with its cause, not a gap.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvstudy.bench.experiment import arm_colors
from kvstudy.io import shorten_words
from kvstudy.speed.analysis import summary_table
from kvstudy.speed.verdicts_table import capture_runs

PERCENTILES = (50, 90, 99)
# name shown, per-request column, what it is
LATENCIES = (
    ("TTFT", "ttft_ms", "time to first token"),
    ("TPOT", "tpot_ms", "time per output token, per request"),
    ("ITL", "itls_ms", "inter-token latency, every gap"),
    ("E2E", "e2el_ms", "end-to-end latency, per request"),
)
PER_TOKEN = {"TPOT", "ITL"}
CAUSE_WIDTH = 140  # characters of a cause shown in a table cell or a figure note (cut at a word)


def min_samples(q: float) -> int:
    """Samples a q-th percentile needs to lie inside the data rather than at its largest value."""
    return math.ceil(100.0 / (100.0 - q) - 1e-9)


def _samples(rows: pd.DataFrame, column: str) -> np.ndarray:
    if not len(rows) or column not in rows.columns:
        return np.array([], dtype=float)
    if column == "itls_ms":
        parts = [np.asarray(x, dtype=float) for x in rows[column] if isinstance(x, (list, tuple, np.ndarray))]
        return np.concatenate(parts) if parts else np.array([], dtype=float)
    return pd.to_numeric(rows[column], errors="coerce").dropna().to_numpy(dtype=float)


def failed_causes(capture: Any) -> dict[tuple[str, int], str]:
    """(configuration, users) -> the first failure cause, for arms with no finished cell there."""
    cells = capture.cells
    if not len(cells):
        return {}
    out: dict[tuple[str, int], str] = {}
    ok = {
        (c, int(u)) for c, u in cells.loc[cells["status"] == "ok", ["configuration", "users"]].itertuples(index=False)
    }
    for _, cell in cells[cells["status"] != "ok"].iterrows():
        key = (str(cell["configuration"]), int(cell["users"]))
        if key not in ok and key not in out:
            out[key] = f"{cell['status']}: {cell.get('reason') or 'no cause recorded'}"
    return out


def _per_token_state(capture: Any, configuration: str, users: int) -> tuple[bool, str]:
    runs = capture_runs(capture, configuration, users)
    bad = [r for r in runs if not r.measurable]
    if not bad:
        return True, ""
    reasons = sorted({reason for r in bad for reason in r.unmeasurable_reasons})
    return False, f"{len(bad)} of {len(runs)} runs: " + "; ".join(reasons)


def percentile_frame(capture: Any, order: list[str]) -> pd.DataFrame:
    """Percentiles per user count, arm and latency (see the module docstring), in arm order: one row
    each, a percentile too few samples resolve left empty, ``measurable`` "yes" or "no: <cause>"."""
    requests = capture.requests
    users_seen = sorted({int(u) for u in capture.cells["users"]}) if len(capture.cells) else []
    failed = failed_causes(capture)
    out: list[dict[str, Any]] = []
    for users in users_seen:
        for name in order:
            key = {"users": users, "configuration": name}
            rows = (
                requests[(requests["users"] == users) & (requests["configuration"] == name)]
                if len(requests)
                else requests
            )
            if (name, users) in failed or not len(rows):
                cause = shorten_words(failed.get((name, users), "no per-request rows"), CAUSE_WIDTH)
                empty = {f"p{q} (ms)": None for q in PERCENTILES}
                out += [
                    {**key, "latency": label, **empty, "samples": 0, "measurable": f"no: {cause}"}
                    for label, _, _ in LATENCIES
                ]
                continue
            ok_rows = rows[rows["success"].astype(bool)] if "success" in rows.columns else rows
            failed_requests = len(rows) - len(ok_rows)
            token_ok, token_cause = _per_token_state(capture, name, users)
            for label, column, _ in LATENCIES:
                values = _samples(ok_rows, column)
                per_q = {
                    f"p{q} (ms)": float(np.percentile(values, q)) if len(values) >= min_samples(q) else None
                    for q in PERCENTILES
                }
                if label in PER_TOKEN and not token_ok:
                    measurable = f"no: {shorten_words(token_cause, CAUSE_WIDTH)}"
                elif failed_requests:
                    measurable = f"no: {failed_requests} of {len(rows)} requests failed (survivors biased)"
                else:
                    measurable = "yes" if len(values) else "no: no samples"
                out.append({**key, "latency": label, **per_q, "samples": len(values), "measurable": measurable})
    columns = ["users", "configuration", "latency", *(f"p{q} (ms)" for q in PERCENTILES), "samples", "measurable"]
    return pd.DataFrame(out, columns=columns)


def percentile_note() -> str:
    """What the percentile table's numbers are and when one is not resolved."""
    needs = ", ".join(f"p{q} {min_samples(q)}" for q in PERCENTILES)
    what = "; ".join(f"{label}: {text}" for label, _, text in LATENCIES)
    return (
        f"Measured: computed from the capture's per-request rows (successful requests, seeds pooled; ITL over every "
        f"gap between tokens), not read from the percentile fields of vLLM's saved results. {what}. A percentile "
        f"needs this many samples to be resolved ({needs}); with fewer it is shown as –."
    )


# --------------------------------------------------------------------------- over concurrency


@dataclass(frozen=True)
class ConcurrencyPoint:
    """One arm at one user count: what the figure draws (or marks, with the cause)."""

    configuration: str
    users: int
    state: str  # "measured", "not measurable" (per-token latency) or "failed" (no finished cell)
    median_tpot_ms: float | None = None  # median over seeds of each cell's median TPOT
    tpot_min_ms: float | None = None
    tpot_max_ms: float | None = None
    output_throughput_tok_s: float | None = None  # median over seeds
    cause: str = ""


def concurrency_points(capture: Any, seeds: pd.DataFrame, order: list[str]) -> list[ConcurrencyPoint]:
    """Per arm and user count: the seed medians of TPOT and throughput (:func:`summary_table`), or why there are none."""
    summary = summary_table(seeds, order).set_index(["configuration", "users"])
    failed = failed_causes(capture)
    users_seen = sorted({int(u) for u in capture.cells["users"]}) if len(capture.cells) else []
    out: list[ConcurrencyPoint] = []
    for name in order:
        for users in users_seen:
            if (name, users) not in summary.index:
                cause = failed.get((name, users), "no finished cell")
                out.append(ConcurrencyPoint(name, users, "failed", cause=shorten_words(cause, CAUSE_WIDTH)))
                continue
            token_ok, cause = _per_token_state(capture, name, users)
            at = summary.loc[(name, users)]
            figures = {
                c: float(at[c]) for c in ("median_tpot_ms", "tpot_min_ms", "tpot_max_ms", "output_throughput_tok_s")
            }
            state = "measured" if token_ok else "not measurable"
            out.append(ConcurrencyPoint(name, users, state, **figures, cause=shorten_words(cause, CAUSE_WIDTH)))
    return out


def plot_concurrency(points: list[ConcurrencyPoint], order: list[str]) -> Any:
    """Median TPOT (seed range as bars) and output throughput over user counts, one line per arm; a
    failed or unmeasurable arm is marked, numbered, with its cause under the axes."""
    import matplotlib.pyplot as plt

    colors = arm_colors(order)
    users = sorted({p.users for p in points})
    marked = [p for p in points if p.state != "measured"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6 + 0.22 * len(marked)))
    for name in order:
        mine = sorted((p for p in points if p.configuration == name and p.state != "failed"), key=lambda p: p.users)
        if not mine:
            continue
        x = [p.users for p in mine]
        tpot = [p.median_tpot_ms for p in mine]
        low = [(p.median_tpot_ms or 0) - (p.tpot_min_ms or 0) for p in mine]
        high = [(p.tpot_max_ms or 0) - (p.median_tpot_ms or 0) for p in mine]
        axes[0].errorbar(x, tpot, yerr=[low, high], color=colors[name], marker="o", capsize=3, label=name)
        axes[1].plot(x, [p.output_throughput_tok_s for p in mine], color=colors[name], marker="o", label=name)
    notes = []
    for number, p in enumerate(marked, 1):
        notes.append(f"[{number}] {p.configuration}, {p.users} user{'s' if p.users != 1 else ''}: {p.state}: {p.cause}")
        # per-token latency unmeasurable leaves the throughput measured: only a failed arm is marked there
        shown = ((axes[0], p.median_tpot_ms), (axes[1], p.output_throughput_tok_s))
        for ax, y in shown if p.state == "failed" else shown[:1]:
            if p.state == "failed" or y is None:
                ax.plot(
                    [p.users], [0], marker="x", ms=10, mew=2, color=colors[p.configuration], clip_on=False, zorder=4
                )
                ax.annotate(f"[{number}]", (p.users, 0), xytext=(4, 4), textcoords="offset points", fontsize=8)
            else:
                ax.plot([p.users], [y], marker="o", ms=11, mfc="white", color=colors[p.configuration], zorder=4)
                ax.annotate(f"[{number}]", (p.users, y), xytext=(6, 6), textcoords="offset points", fontsize=8)
    for ax, label in zip(axes, ("median TPOT (ms, seed range as bars)", "output throughput (tokens/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(users, [str(u) for u in users])
        ax.minorticks_off()
        ax.set_xlabel("concurrent users")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    if notes:
        wrapped = "\n".join(textwrap.fill(n, 140, subsequent_indent="     ") for n in notes)
        fig.text(0.01, 0.0, "Marked: " + wrapped, ha="left", va="top", fontsize=8)
    fig.tight_layout()
    return fig
