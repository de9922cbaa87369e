"""Analyse a speed sweep: the study's table, per-seed ranges, figures and a clock-adjusted estimate,
from a capture folder or from a published summary (only what it printed: what it lacks is reported
missing, never filled in); latency percentiles and speed over concurrency. Verdicts are
:mod:`kvstudy.speed.verdicts_table`'s.

Percentiles are computed from the pooled per-request rows (vLLM's per-run percentiles cannot be
pooled over seeds); a percentile q needs ``100 / (100 - q)`` samples to be resolved. An arm whose
cells failed, or whose per-token latency was not measurable, is marked with its cause, not a gap.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvstudy.bench import grid
from kvstudy.bench.spec import ServerSpec
from kvstudy.errors import StudyError
from kvstudy.io import read_json, shorten_words
from kvstudy.run_record import ab_guard
from kvstudy.speed.runner import KIND, SweepSpec, load_spec, run_sweep
from kvstudy.speed.spec import Capture
from kvstudy.speed.verdicts_table import capture_runs

# the study's table per user count and arm: medians over seeds, the seed range, seed counts
SUMMARY = {
    "median_tpot_ms": ("median_tpot_ms", "median"),
    "tpot_min_ms": ("median_tpot_ms", "min"),
    "tpot_max_ms": ("median_tpot_ms", "max"),
    "output_throughput_tok_s": ("output_throughput_tok_s", "median"),
    "median_clock_mhz": ("median_clock_mhz", "median"),
    "seeds": ("seed", "nunique"),
}
SUMMARY_COLUMNS = ["users", "configuration", "kv_cache_dtype", *SUMMARY]


# --------------------------------------------------------------------------- loading


def load_capture(path: str | Path) -> Capture:
    """Read a sweep capture folder; StudyError if it is not one. In a collected capture (``kvstudy
    collect``) each block's cells are on its own node's monotonic clock; the manifest's
    ``timeline_offset_s`` per block lays the blocks end to end in plan order."""
    cap = grid.read_users_capture(
        load_spec, KIND, ("cell_id", "configuration", "kv_cache_dtype", "seed", "users"), path
    )
    for block in (cap.manifest.get("blocks") or []) if len(cap.cells) else []:
        offset = block.get("timeline_offset_s")
        mine = cap.cells["cell_id"].isin(block.get("items") or [])
        for column in ("started_mono_s", "ended_mono_s"):
            if isinstance(offset, (int, float)) and column in cap.cells:
                cap.cells.loc[mine, column] += offset
    return cap


def seed_table(capture: Capture) -> pd.DataFrame:
    """One row per successful cell: the per-seed values every summary is built from."""
    cols = [
        "users",
        "configuration",
        "kv_cache_dtype",
        "seed",
        "median_tpot_ms",
        "median_ttft_ms",
        "median_itl_ms",
        "output_throughput_tok_s",
        "median_clock_mhz",
        "completed",
    ]
    if not len(capture.cells):
        return pd.DataFrame(columns=cols)
    ok = capture.cells.loc[capture.cells["status"] == "ok", cols]
    by_arm = _arm_order([c.name for c in capture.spec.configurations])
    return ok.sort_values(["users", "configuration", "seed"], key=by_arm).reset_index(drop=True)


def _arm_order(order: list[str]) -> Callable[[pd.Series], pd.Series]:
    """A ``sort_values`` key that sorts the configuration column in ``order`` (the others as they are)."""
    rank = {name: i for i, name in enumerate(order)}
    return lambda column: column.map(rank) if column.name == "configuration" else column


def summary_table(seeds: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The study's table from per-seed rows: medians over seeds, seed ranges, seed counts."""
    if not len(seeds):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    out = seeds.groupby(SUMMARY_COLUMNS[:3], sort=False).agg(**SUMMARY).reset_index()
    return out.sort_values(["users", "configuration"], key=_arm_order(order)).reset_index(drop=True)


# --------------------------------------------------------------------------- published summary


@dataclass
class Published:
    """A published speed table: rows as printed, what the text claimed, and what it left out."""

    path: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    verdicts: list[dict[str, Any]]
    not_published: list[str]


def load_published(path: str | Path) -> Published:
    path = Path(path)
    data = read_json(path)
    if data.get("source") != "published":
        raise StudyError(f"{path}: field 'source' must be 'published' for a published summary")
    rows = data.get("rows")
    need = {"users", "configuration", "median_tpot_ms", "output_throughput_tok_s", "median_clock_mhz", "seeds"}
    if not rows or not all(isinstance(r, dict) and need <= set(r) for r in rows):
        raise StudyError(f"{path}: field 'rows' must list mappings with {sorted(need)}")
    dtypes = {c["name"]: c.get("kv_cache_dtype", "") for c in data.get("configurations", [])}
    table = pd.DataFrame(rows)
    table["kv_cache_dtype"] = table["configuration"].map(dtypes)
    table[["tpot_min_ms", "tpot_max_ms"]] = np.nan  # per-seed values were not published
    meta = {k: v for k, v in data.items() if k not in ("rows", "published_verdicts", "not_published")}
    return Published(
        path, meta, table[SUMMARY_COLUMNS], data.get("published_verdicts", []), data.get("not_published", [])
    )


# --------------------------------------------------------------------------- clock-adjusted estimate


def clock_adjusted(seeds: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per candidate (``order[1:]``) and user count, OLS of ``median_tpot_ms ~ candidate + median_clock_mhz``
    over the cells against the baseline ``order[0]``; the clock term only where the clock was read and
    varies (else it cannot be told from the intercept)."""
    users = sorted(seeds["users"].unique())
    return pd.DataFrame([_clock_adjusted(seeds, order[0], cand, int(u)) for cand in order[1:] for u in users])


def _clock_adjusted(seeds: pd.DataFrame, baseline: str, candidate: str, users: int) -> dict[str, Any]:
    import statsmodels.formula.api as smf

    d = seeds[(seeds["users"] == users) & seeds["configuration"].isin([baseline, candidate])].copy()
    d["candidate"] = (d["configuration"] == candidate).astype(int)
    n = len(d)
    row: dict[str, Any] = {"candidate": candidate, "users": users, "cells": n, "model": ""}
    empty = {"TPOT change (ms)": None, "95 % interval (ms)": None, "change (%)": None}
    if d["candidate"].nunique() < 2:
        return {**row, **empty, "note": "one arm has no successful cells"}
    clock = pd.to_numeric(d["median_clock_mhz"], errors="coerce")
    use_clock = bool(clock.notna().all() and clock.nunique() > 1)
    row["model"] = "median_tpot_ms ~ candidate" + (" + clock_100mhz" if use_clock else "")
    if use_clock:
        d["clock_100mhz"] = clock / 100.0
        corr = np.corrcoef(d["candidate"], d["clock_100mhz"])[0, 1]
    n_params = 3 if use_clock else 2
    if n <= n_params:
        return {**row, **empty, "note": f"{n} cells for {n_params} coefficients: no residual degrees of freedom"}
    fit = smf.ols(row["model"], data=d).fit()
    lo, hi = fit.conf_int(0.05).loc["candidate"]
    base_mean = float(d.loc[d["candidate"] == 0, "median_tpot_ms"].mean())
    effect = float(fit.params["candidate"])
    if use_clock:
        note = f"clock varies across cells ({clock.min():.0f} to {clock.max():.0f} MHz); adjusted for it"
        if abs(corr) > 0.9:
            note += f"; the clock is nearly confounded with the arm (r = {corr:.2f}), so the split is fragile"
    elif clock.notna().all():
        note = (
            f"clock not varied / not measured (the same {clock.iloc[0]:g} MHz reading in every cell): no clock "
            "term: a plain difference (a constant reading says nothing about the clocks)"
        )
    else:
        note = "no clock readings: plain difference"
    note += f"; {n} cells, {int(fit.df_resid)} residual degrees of freedom, 95 % interval"
    return {
        **row,
        "TPOT change (ms)": round(effect, 3),
        "95 % interval (ms)": f"{lo:.3f} to {hi:.3f}",
        "change (%)": round(effect / base_mean * 100.0, 2),
        "note": note,
    }


# --------------------------------------------------------------------------- A/B guard


def ab_differences(capture: Capture, baseline: str, candidate: str) -> pd.DataFrame:
    """Per seed, what the resolved-run records of the two arms differ in besides the KV dtype."""
    rows = []
    for seed in capture.spec.seeds:
        missing = grid.Captured("", {})
        a = capture.grid.runs.get(f"{baseline}__s{seed}", missing).data
        b = capture.grid.runs.get(f"{candidate}__s{seed}", missing).data
        whole = {"seed": seed, "field": "(run record)"}
        if a.get("status") != "ok" or b.get("status") != "ok":
            rows.append({**whole, baseline: a.get("status", "missing"), candidate: b.get("status", "missing")})
            continue
        try:
            diffs = ab_guard(a.get("record") or {}, b.get("record") or {})
        except StudyError as exc:
            rows.append(
                {**whole, baseline: a.get("record_error", ""), candidate: b.get("record_error", ""), "note": str(exc)}
            )
            continue
        for d in diffs:
            rows.append({"seed": seed, "field": d.field, baseline: _short(d.a), candidate: _short(d.b), "note": d.note})
    return pd.DataFrame(rows, columns=["seed", "field", baseline, candidate, "note"])


def _short(value: Any) -> str:
    return shorten_words(value if isinstance(value, str) else json.dumps(value, default=str), 80)


# --------------------------------------------------------------------------- figures


def plot_seed_ranges(seeds: pd.DataFrame, order: list[str], failed: dict[tuple[str, int], str] | None = None) -> Any:
    """Median TPOT per seed (dots) and the seed range (bar) per configuration and user count; an arm
    with no finished cell at a user count (``failed``: its cause) is an ``×`` on the axis, numbered,
    with the cause under the figure."""
    import matplotlib.pyplot as plt

    failed = failed or {}
    users = sorted({*seeds["users"].unique(), *(u for _, u in failed)})
    fig, axes = plt.subplots(1, len(users), figsize=(4.2 * len(users), 3.2), squeeze=False)
    colors = grid.arm_colors(order)
    notes: list[str] = []
    for ax, u in zip(axes[0], users):
        for i, name in enumerate(order):
            vals = seeds[(seeds["users"] == u) & (seeds["configuration"] == name)]["median_tpot_ms"]
            if not len(vals):
                if (name, int(u)) in failed:
                    notes.append(
                        f"[{len(notes) + 1}] {name}, {u} user(s): {shorten_words(failed[(name, int(u))], 150)}"
                    )
                    grid.mark_no_run(ax, i, colors[name])
                    ax.annotate(
                        f"no run [{len(notes)}]", (i, 0.04), xycoords=("data", "axes fraction"), ha="center", fontsize=8
                    )
                continue
            ax.plot([i, i], [vals.min(), vals.max()], color=colors[name], lw=6, alpha=0.35, solid_capstyle="butt")
            ax.scatter([i] * len(vals), vals, color=colors[name], zorder=3)
        ax.set_xticks(range(len(order)), order)
        ax.set_xlim(-0.7, len(order) - 0.3)
        ax.set_title(f"{u} user{'s' if u != 1 else ''}")
        ax.set_ylabel("median TPOT per seed (ms)")
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), ha="left", va="top", fontsize=8)
    fig.tight_layout()
    return fig


def plot_distributions(requests: pd.DataFrame, order: list[str]) -> Any:
    """Empirical CDFs of TTFT, TPOT (per request) and ITL (per token gap), seeds pooled."""
    import matplotlib.pyplot as plt

    users = sorted(requests["users"].unique())
    fig, axes = plt.subplots(len(users), 3, figsize=(12, 2.8 * len(users)), squeeze=False)
    colors = grid.arm_colors(order)
    ok = requests[requests["success"]]
    for row, u in zip(axes, users):
        for ax, (label, column, _) in zip(row, LATENCIES):  # TTFT, TPOT, ITL
            for name in order:
                r = ok[(ok["users"] == u) & (ok["configuration"] == name)]
                if len(values := np.sort(_samples(r, column))):
                    share = np.arange(1, len(values) + 1) / len(values)
                    ax.step(values, share, where="post", color=colors[name], label=name)
            ax.set_xlabel(f"{label} (ms)")
            ax.set_ylabel(f"{u} user{'s' if u != 1 else ''}: share ≤ x")
        row[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_clock(telemetry: pd.DataFrame, order: list[str]) -> Any:
    """Clock (and utilisation) over time per cell, 0 = first measured request, from 3 s before it."""
    import matplotlib.pyplot as plt

    telemetry = telemetry[telemetry["t_rel_s"] >= -3.0]
    users = sorted(telemetry["users"].unique())
    has_util = "util_pct" in telemetry and telemetry["util_pct"].notna().any()
    nrows = 2 if has_util else 1
    fig, axes = plt.subplots(nrows, len(users), figsize=(4.8 * len(users), 2.8 * nrows), squeeze=False)
    colors = grid.arm_colors(order)
    device = str(telemetry["device"].iloc[0])
    for j, u in enumerate(users):
        t = telemetry[telemetry["users"] == u]
        for (name, seed), g in t.groupby(["configuration", "seed"]):
            axes[0][j].plot(g["t_rel_s"], g["clock_mhz"], color=colors.get(name), lw=1, label=f"{name} seed {seed}")
            if has_util:
                axes[1][j].plot(g["t_rel_s"], g["util_pct"], color=colors.get(name), lw=1)
        axes[0][j].set_title(f"{u} user{'s' if u != 1 else ''}")
        axes[0][j].set_ylabel("SM clock (MHz)" if device.startswith("gpu") else "core clock (MHz)")
        axes[0][j].axvline(0, color="grey", lw=0.8, ls=":")
        axes[-1][j].set_xlabel("seconds from the first measured request")
        if has_util:
            axes[1][j].set_ylabel("utilisation (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def describe_spec(spec: SweepSpec) -> pd.DataFrame:
    """The grid and what was held fixed, as a two-column table: the grid's own fields, then the
    server's (``bench.spec.ServerSpec``, which pydantic lists first), then ``scrape_metrics``."""
    d = spec.to_dict()
    own = [k for k in d if k not in ServerSpec.model_fields]
    d = {k: d[k] for k in [*own[:-1], *ServerSpec.model_fields, own[-1]]}
    d["configurations"] = "; ".join(
        f"{c.name}: kv {c.kv_cache_dtype}"
        + (f", backend {c.attention_backend}" if c.attention_backend else "")
        + (f", env {c.env}" if c.env else "")
        for c in spec.configurations
    )
    shown = ["yes" if v is True else "no" if v is False else str(v) for v in d.values()]
    return pd.DataFrame({"setting": list(d), "value": shown})


# --------------------------------------------------------------------------- notebook helpers


open_or_complete = partial(
    grid.open_or_complete, SweepSpec, run_sweep, load_capture, "only the published table is shown"
)
capture_settings = partial(grid.capture_settings, load_spec)


def cell_status_frame(capture: Capture) -> pd.DataFrame:
    """Each cell of the grid: its status (the manifest's where no record was read) and reason."""
    status = capture.manifest.get("items") or capture.manifest.get("cells") or {}
    got = {c.id: capture.grid.cells.get(c.id) for c in capture.spec.cells()}
    return pd.DataFrame(
        [
            {"cell": i, "status": g.status if g else status.get(i, "missing"), "reason": g.reason if g else ""}
            for i, g in got.items()
        ]
    )


# --------------------------------------------------------------------------- latency percentiles


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
    """A latency's values in ``rows`` (every gap between tokens for ITL)."""
    if column == "itls_ms":
        return np.concatenate([np.asarray(x, dtype=float) for x in rows[column]] + [np.array([])])
    return pd.to_numeric(rows[column], errors="coerce").dropna().to_numpy(dtype=float)


def _users_seen(capture: Any) -> list[int]:
    return sorted({int(u) for u in capture.cells["users"]}) if len(capture.cells) else []


def failed_causes(capture: Any) -> dict[tuple[str, int], str]:
    """(configuration, users) -> the first failure cause, for arms with no finished cell there."""
    cells = capture.cells
    out: dict[tuple[str, int], str] = {}
    if not len(cells):
        return out
    ok = set(zip(cells.loc[cells["status"] == "ok", "configuration"], cells.loc[cells["status"] == "ok", "users"]))
    for _, cell in cells[cells["status"] != "ok"].iterrows():
        if (cell["configuration"], cell["users"]) not in ok:
            key = (str(cell["configuration"]), int(cell["users"]))
            out.setdefault(key, f"{cell['status']}: {cell.get('reason') or 'no cause recorded'}")
    return out


def _per_token_cause(capture: Any, configuration: str, users: int) -> str:
    """Why per-token latency is not measured in some of the arm's runs ("" when it is in all)."""
    runs = capture_runs(capture, configuration, users)
    bad = [r for r in runs if not r.measurable]
    reasons = sorted({reason for r in bad for reason in r.unmeasurable_reasons})
    return f"{len(bad)} of {len(runs)} runs: " + "; ".join(reasons) if bad else ""


def percentile_frame(capture: Any, order: list[str]) -> pd.DataFrame:
    """Percentiles per user count, arm and latency (see the module docstring), in arm order: one row
    each, a percentile too few samples resolve left empty, ``measurable`` "yes" or "no: <cause>"."""
    requests, failed = capture.requests, failed_causes(capture)
    by_arm = dict(iter(requests.groupby(["users", "configuration"]))) if len(requests) else {}
    out: list[dict[str, Any]] = []
    for users in _users_seen(capture):
        for name in order:
            key = {"users": users, "configuration": name}
            rows = by_arm.get((users, name), requests.iloc[:0])
            gone = failed.get((name, users), "" if len(rows) else "no per-request rows")
            ok_rows = rows if gone else rows[rows["success"]]
            token_cause = "" if gone else _per_token_cause(capture, name, users)
            for label, column, _ in LATENCIES:
                values = np.array([]) if gone else _samples(ok_rows, column)
                if gone:
                    measurable = f"no: {shorten_words(gone, CAUSE_WIDTH)}"
                elif label in PER_TOKEN and token_cause:
                    measurable = f"no: {shorten_words(token_cause, CAUSE_WIDTH)}"
                elif len(ok_rows) < len(rows):
                    measurable = f"no: {len(rows) - len(ok_rows)} of {len(rows)} requests failed (survivors biased)"
                else:
                    measurable = "yes" if len(values) else "no: no samples"
                per_q = {
                    f"p{q} (ms)": float(np.percentile(values, q)) if len(values) >= min_samples(q) else None
                    for q in PERCENTILES
                }
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
    out: list[ConcurrencyPoint] = []
    for name in order:
        for users in _users_seen(capture):
            if (name, users) not in summary.index:
                cause = failed.get((name, users), "no finished cell")
                out.append(ConcurrencyPoint(name, users, "failed", cause=shorten_words(cause, CAUSE_WIDTH)))
                continue
            cause = _per_token_cause(capture, name, users)
            at = summary.loc[(name, users)]
            figures = {
                c: float(at[c]) for c in ("median_tpot_ms", "tpot_min_ms", "tpot_max_ms", "output_throughput_tok_s")
            }
            state = "not measurable" if cause else "measured"
            out.append(ConcurrencyPoint(name, users, state, **figures, cause=shorten_words(cause, CAUSE_WIDTH)))
    return out


def plot_concurrency(points: list[ConcurrencyPoint], order: list[str]) -> Any:
    """Median TPOT (seed range as bars) and output throughput over user counts, one line per arm; a
    failed or unmeasurable arm is marked, numbered, with its cause under the axes."""
    import matplotlib.pyplot as plt

    colors = grid.arm_colors(order)
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
