"""Analyse a load capture: per-cell table, each arm's users within the target, the ratio to the
16-bit baseline with its test, per-load tests, figures and the verdict's facts. An arm identical to
the baseline but for its name is the A/A control.

A request is within the target as vLLM's ``bench serve --goodput`` counts it
(:func:`kvstudy.load.runner.share_within`); a cell meets the target when ``target_share`` of its
requests are within it; an arm's users within the target in one seed block is the largest load up to
which every cell met it. Across seed blocks the ratio is the geometric mean of per-block ratios with a
t interval, tested by the seed-blocked permutation test; a claim needs the Holm p below alpha, the
interval excluding 1 and a measured knee in every block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvstudy.bench import grid
from kvstudy.bench.telemetry import metrics_delta
from kvstudy.capture import model_config
from kvstudy.formats import GIB
from kvstudy.load.runner import KIND, load_spec, run_load
from kvstudy.load.spec import LoadSpec, arm_pools
from kvstudy.stats.binary import clustered_mean, holm
from kvstudy.stats.permutation import blocks_needed, permutation_test

ALPHA = 0.05
CONFIDENCE = 0.95
MEASURED, MISSED, HELD, NO_CELLS = "measured", "missed at the lowest load", "held at every load", "no finished cell"
PERCENTILES = (50, 90, 99)
PEAKS = (("running", "running"), ("waiting", "waiting"), ("KV usage", "kv_usage"))  # cell_table columns


LoadCapture = grid.UsersCapture[LoadSpec]


def _capture_spec(path: Path, manifest: Mapping[str, Any]) -> LoadSpec:
    # The pools are computed from the config.json the capture keeps (the served folder may not be here:
    # a fresh clone renders the bundled capture without the project-built model).
    spec = load_spec(path, manifest)
    return spec.model_copy(update={"model": str(model_config(path, spec.model).parent)})


load_capture = partial(grid.read_users_capture, _capture_spec, KIND, ("arm", "seed", "concurrency"))


def arm_order(cap: LoadCapture) -> list[str]:
    return [a.name for a in cap.spec.arms]


# --------------------------------------------------------------------------- knees and their comparison


@dataclass(frozen=True)
class Knee:
    """One arm's users within the target in one seed block."""

    users: int
    state: str  # MEASURED, MISSED, HELD or NO_CELLS
    last_met: int | None = None  # the largest load that met the target before the first miss
    first_miss: int | None = None  # the load at which the target was first missed


def users_within(shares: Mapping[int, float | None], target_share: float) -> Knee:
    """The knee of one ladder: ``shares`` maps each load to its share within the target (None: the
    cell did not run, counted as a miss)."""
    loads = sorted(shares)
    if not loads or all(shares[load] is None for load in loads):
        return Knee(0, NO_CELLS)
    last = None
    for load in loads:
        share = shares[load]
        if share is None or share < target_share:
            return Knee(0, MISSED, None, load) if last is None else Knee(last, MEASURED, last, load)
        last = load
    return Knee(loads[-1], HELD, loads[-1], None)


@dataclass
class UsersComparison:
    """Candidate vs baseline users within the target over seed blocks."""

    baseline: str
    candidate: str
    blocks: int
    baseline_users: list[int]
    candidate_users: list[int]
    baseline_states: list[str]
    candidate_states: list[str]
    ratio: float | None = None  # geometric mean of per-block candidate / baseline
    ratio_low: float | None = None
    ratio_high: float | None = None
    p_value: float | None = None
    min_p_value: float | None = None
    p_holm: float | None = None
    claim: str = "no claim"
    reasons: list[str] = field(default_factory=list)

    @property
    def users_baseline(self) -> int | None:
        return int(np.median(self.baseline_users)) if self.baseline_users else None

    @property
    def users_candidate(self) -> int | None:
        return int(np.median(self.candidate_users)) if self.candidate_users else None


def compare_users(
    baseline: str,
    candidate: str,
    base: Mapping[int, Knee],
    cand: Mapping[int, Knee],
) -> UsersComparison:
    """Users within the target of two arms over the seed blocks both have (keys: seeds). No Holm here."""
    seeds = [s for s in base if s in cand]
    out = UsersComparison(
        baseline,
        candidate,
        len(seeds),
        [base[s].users for s in seeds],
        [cand[s].users for s in seeds],
        [base[s].state for s in seeds],
        [cand[s].state for s in seeds],
    )
    if not seeds:
        out.reasons.append("no seed block holds both arms")
        return out
    usable = [s for s in seeds if base[s].users > 0 and cand[s].users > 0]
    if len(usable) < len(seeds):
        out.reasons.append(
            f"{len(seeds) - len(usable)} seed block(s) with no load within the target for an arm: no ratio there"
        )
    if not usable:
        return out
    logs = np.log([cand[s].users / base[s].users for s in usable])
    out.ratio = float(math.exp(logs.mean()))
    if logs.size >= 2:  # the t interval of the mean log ratio: each block its own cluster
        mean = clustered_mean(logs, range(logs.size), alpha=1 - CONFIDENCE)
        out.ratio_low, out.ratio_high = math.exp(mean.ci_low), math.exp(mean.ci_high)
    test = permutation_test(
        [math.log(base[s].users) for s in usable],
        [math.log(cand[s].users) for s in usable],
        base_blocks=usable,
        cand_blocks=usable,
    )
    out.p_value, out.min_p_value = test.p_value, test.min_p_value
    return out


def blocks_for_family(tests: int) -> int:
    """Seed blocks (one run per arm each) with which the blocked test's smallest p passes Holm's first
    step over ``tests`` tests (tests x its smallest p < ALPHA)."""
    return blocks_needed(ALPHA / max(1, tests))


def decide(comparisons: Sequence[UsersComparison], other_p: Sequence[float] = ()) -> list[float]:
    """Holm over the users tests and ``other_p`` (the report's other tests), then each claim, in place;
    returns the Holm p of ``other_p``."""
    tested = [c for c in comparisons if c.p_value is not None]
    adjusted = holm([float(c.p_value) for c in tested if c.p_value is not None] + list(other_p))
    for c, p in zip(tested, adjusted):
        c.p_holm = p
    for c in comparisons:
        c.claim = "no claim"
        if c.p_value is None:
            continue
        family = len(tested) + len(other_p)
        if c.min_p_value is not None and c.min_p_value * family >= ALPHA:
            c.reasons.append(
                f"{c.blocks} seed block(s) cannot reach p < {ALPHA:g} after Holm over {family} test(s) (smallest p "
                f"{c.min_p_value:.3g}; {blocks_for_family(family)} blocks can)"
            )
        censored = [s for s in (*c.baseline_states, *c.candidate_states) if s != MEASURED]
        if censored:
            c.reasons.append(
                "not every block has a measured knee (" + ", ".join(sorted(set(censored))) + "): the count is a bound"
            )
        excludes_one = c.ratio_low is not None and c.ratio_high is not None and (c.ratio_low > 1 or c.ratio_high < 1)
        if c.p_holm is not None and c.p_holm < ALPHA and excludes_one and not censored:
            c.claim = "more users" if (c.ratio or 1) > 1 else "fewer users"
        elif c.p_holm is not None and c.p_holm >= ALPHA:
            c.reasons.append(f"p after Holm {c.p_holm:.3g} ≥ {ALPHA:g}")
        elif not excludes_one:
            c.reasons.append("the interval of the ratio holds 1")
    return adjusted[len(tested) :]


# --------------------------------------------------------------------------- tables


def cell_table(cap: LoadCapture) -> pd.DataFrame:
    """One row per cell: status, share within the target, goodput, throughput, latency percentiles, queueing."""
    rows = []
    for _, c in cap.cells.iterrows():
        row: dict[str, Any] = {
            "arm": c["arm"],
            "seed": int(c["seed"]),
            "users": int(c["concurrency"]),
            "status": c["status"],
            "within target": c.get("share_within_target"),
            "goodput (req/s)": c.get("goodput_req_s"),
            "output tok/s": c.get("output_throughput_tok_s"),
            "req/s": c.get("request_throughput_req_s"),
        }
        if len(cap.requests):
            cell = cap.grid.cells[c["cell_id"]]  # a failed cell's requests are not summarised
            ok = [r for r in cell.requests if r.success] if cell.ok else []
            for metric in ("ttft", "tpot", "e2el"):
                values = [v for r in ok if (v := getattr(r, f"{metric}_ms")) is not None]
                for q in PERCENTILES:
                    row[f"{metric.upper()} p{q} (ms)"] = float(np.percentile(values, q)) if values else None
            itls = [x for r in ok for x in r.itls_ms]
            row["ITL p99 (ms)"] = float(np.percentile(itls, 99)) if itls else None
        before, after = c.get("server_metrics_before"), c.get("server_metrics_after")
        delta = metrics_delta(before if isinstance(before, dict) else None, after if isinstance(after, dict) else None)
        if "preemptions" in delta:
            row["preemptions"] = delta["preemptions"]
        row["mean queue (s)"] = delta.get("mean_queue_time_s")
        row |= {f"peak {what}": c.get(f"peak_{column}") for what, column in PEAKS}
        rows.append({**row, "reason": c.get("reason") or ""})
    order = arm_order(cap)
    return pd.DataFrame(sorted(rows, key=lambda r: (order.index(r["arm"]), r["seed"], r["users"])))


def _ok_cells(cap: LoadCapture) -> pd.DataFrame:
    """The finished cells, indexed by (arm, seed, concurrency)."""
    c = cap.cells
    if not len(c):
        return pd.DataFrame(columns=["share_within_target", "peak_waiting"])
    return c[c["status"] == "ok"].set_index(["arm", "seed", "concurrency"])


def knees(cap: LoadCapture) -> dict[str, dict[int, Knee]]:
    """Each arm's knee per seed block (cells that failed count as misses; a block with no finished cell is left out)."""
    share, loads = _ok_cells(cap)["share_within_target"], cap.spec.loads()
    per = {
        arm: {
            s: users_within({n: share.get((arm, s, n)) for n in loads}, cap.spec.target_share) for s in cap.spec.seeds
        }
        for arm in arm_order(cap)
    }
    return {arm: {s: k for s, k in seeds.items() if k.state != NO_CELLS} for arm, seeds in per.items()}


def comparisons(cap: LoadCapture) -> tuple[list[UsersComparison], pd.DataFrame]:
    """Baseline vs each other arm on users within the target, and per-load tests of the share within
    the target (seed-blocked permutation), Holm over all of them; claims decided."""
    order = arm_order(cap)
    k = knees(cap)
    comps = [compare_users(order[0], arm, k[order[0]], k[arm]) for arm in order[1:]]
    share = _ok_cells(cap)["share_within_target"]
    done, rows, p_values = set(share.index), [], []
    for arm in order[1:]:
        for load in cap.spec.loads():
            seeds = [s for s in cap.spec.seeds if {(order[0], s, load), (arm, s, load)} <= done]
            row: dict[str, Any] = {"comparison": f"{order[0]} → {arm}", "users": load, "seed blocks": len(seeds)}
            if seeds:
                base, cand = ([float(share[(a, s, load)]) for s in seeds] for a in (order[0], arm))
                test = permutation_test(base, cand, base_blocks=seeds, cand_blocks=seeds)
                row.update(
                    {"share within target, change": test.statistic, "p": test.p_value, "smallest p": test.min_p_value}
                )
                p_values.append(test.p_value)
            rows.append(row)
    adjusted = decide(comps, other_p=p_values)
    per_load = pd.DataFrame(rows)
    if p_values:
        per_load.loc[per_load["p"].notna(), "p, Holm"] = adjusted
    return comps, per_load


def users_table(cap: LoadCapture) -> pd.DataFrame:
    """Per arm: users within the target per seed block, the median, the predicted capacity (requests its
    pool holds at input + output) and whether the knee sits within one load step of it."""
    pools = arm_pools(cap.spec)
    loads = cap.spec.loads()
    k = knees(cap)
    rows = []
    for arm in arm_order(cap):
        per = k.get(arm, {})
        values = [per[s].users for s in sorted(per)]
        predicted = pools[arm].requests
        median = int(np.median(values)) if values else None
        rows.append(
            {
                "arm": arm,
                "kv dtype": cap.spec.arm(arm).kv_cache_dtype,
                "users within target (median)": median,
                "per seed block": ", ".join(f"s{s}: {per[s].users}" for s in sorted(per)) or "–",
                "states": ", ".join(sorted({per[s].state for s in per})) or "no finished cell",
                "predicted capacity (requests)": predicted,
                "knee vs capacity": _against(median, predicted, loads, [per[s].state for s in per])
                + _why_below(cap, arm, per, predicted),
            }
        )
    return pd.DataFrame(rows)


def _against(median: int | None, predicted: int, loads: list[int], states: list[str]) -> str:
    if median is None:
        return "no finished cell"
    if any(s != MEASURED for s in states):
        return "not a measured knee in every block (" + ", ".join(sorted(set(states) - {MEASURED})) + ")"
    below = max([x for x in loads if x <= predicted], default=None)
    above = min([x for x in loads if x > predicted], default=None)
    if median in (below, above) or median == predicted:
        return "within one load step"
    return f"{'below' if median < predicted else 'above'} it by more than one load step"


def _why_below(cap: LoadCapture, arm: str, per: dict[int, Knee], predicted: int) -> str:
    """Where a knee sits below the capacity: whether requests queued at the first missed load (the pool
    binds) or none waited there (the latency target binds first: per-token speed, not capacity)."""
    misses = [(s, k.first_miss) for s, k in per.items() if k.first_miss is not None and k.first_miss <= predicted]
    peak = _ok_cells(cap)["peak_waiting"]
    waited = [float(peak[(arm, s, n)] or 0.0) for s, n in misses if (arm, s, n) in peak.index]
    if waited and max(waited) == 0:
        return "; no request waited at the first missed load: the latency target binds before the pool does"
    return ""


def comparison_frame(comps: list[UsersComparison], spec: LoadSpec) -> pd.DataFrame:
    aa = set(spec.aa_arms())
    return pd.DataFrame(
        [
            {
                "comparison": f"{c.baseline} → {c.candidate}" + (" (A/A)" if c.candidate in aa else ""),
                "seed blocks": c.blocks,
                f"users {c.baseline}": c.users_baseline,
                "users candidate": c.users_candidate,
                "ratio": c.ratio,
                "95 % interval": "–" if c.ratio_low is None else f"{c.ratio_low:.2f} to {c.ratio_high:.2f}",
                "p": c.p_value,
                "smallest p": c.min_p_value,
                "p, Holm": c.p_holm,
                "claim": c.claim,
                "why": "; ".join(c.reasons),
            }
            for c in comps
        ]
    )


# --------------------------------------------------------------------------- figures


def plot_load(cap: LoadCapture, cells: pd.DataFrame) -> Any:
    """Output throughput, goodput and TTFT p99 against the offered load, per arm (seed medians, seeds as
    dots), each arm's predicted capacity as a vertical line; an arm without a finished cell at a load
    is an × at the axis with its cause under the figure."""
    import matplotlib.pyplot as plt

    order = arm_order(cap)
    colors = grid.arm_colors(order)
    pools = arm_pools(cap.spec)
    panels = (
        ("output tok/s", "output tokens/s"),
        ("goodput (req/s)", "goodput (requests/s within target)"),
        ("TTFT p99 (ms)", "TTFT p99 (ms)"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    notes: list[str] = []
    for arm in order:
        color = colors[arm]
        mine = cells[cells["arm"] == arm] if len(cells) else cells
        ok = mine[mine["status"] == "ok"] if len(mine) else mine
        for ax, (column, label) in zip(axes, panels):
            if len(ok) and column in ok:
                med = ok.groupby("users")[column].median()
                ax.plot(med.index, med.values, marker="o", color=color, label=arm)
                ax.scatter(ok["users"], ok[column], color=color, s=10, alpha=0.5)
            ax.axvline(pools[arm].requests, color=color, ls=":", lw=1)
            ax.set_xlabel("offered load (concurrent users)")
            ax.set_ylabel(label)
        failed = mine[mine["status"] != "ok"] if len(mine) else mine
        for users in sorted(set(failed["users"]) - set(ok["users"])) if len(failed) else []:
            cause = str(failed[failed["users"] == users]["reason"].iloc[0])
            notes.append(f"[{len(notes) + 1}] {arm} at {users} users: {cause[:140]}")
            for ax in axes:
                grid.mark_no_run(ax, users, color, ms=9)
    axes[0].legend(fontsize=8, title="dotted: predicted capacity", title_fontsize=7)
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), ha="left", va="top", fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- verdict


def verdict_facts(cap: LoadCapture | None, comps: list[UsersComparison]) -> dict[str, Any]:
    """The structured verdict the decision card reads (``kvstudy.report.notebook.verdict`` keyword facts)."""
    spec = cap.spec if cap is not None else None
    aa = set(spec.aa_arms()) if spec else set()
    fp8 = (
        c for c in comps if c.candidate not in aa and spec and spec.arm(c.candidate).kv_cache_dtype.startswith("fp8")
    )
    main = next(fp8, None)
    of_main = {"users_baseline": "users_baseline", "users_fp8": "users_candidate", "users_ratio": "ratio"}
    of_main |= {"users_ratio_low": "ratio_low", "users_ratio_high": "ratio_high"}
    facts: dict[str, Any] = {
        **{key: getattr(main, name, None) for key, name in of_main.items()},
        "claim": main.claim if main else "no claim",
        "latency_target": spec.target_text() if spec else "",
        "kv_memory_gib": spec.kv_memory_bytes / GIB if spec else 0.0,
        "context_tokens": spec.context_tokens if spec else 0,
    }
    if main is None or not main.candidate_users:
        state = "not measured"  # no FP8 arm, or none of its cells finished (e.g. an AVX2 CPU refused it)
    else:
        state = "measured" if main.claim != "no claim" else "no claim"
    return {"state": state, **facts}


def family_size(cap: LoadCapture) -> int:
    """Tests in this report's Holm family: a users test per comparison and a test per comparison and load."""
    return (len(cap.spec.arms) - 1) * (1 + len(cap.spec.loads()))


capture_settings = partial(grid.capture_settings, load_spec)


def verdict_text(cap: LoadCapture | None, comps: list[UsersComparison]) -> str:
    if cap is None:
        return "No load capture: what FP8 buys at equal memory was not measured."
    spec, mem = cap.spec, cap.spec.kv_memory_bytes
    aa = set(spec.aa_arms())
    memory = f"{mem / GIB:.3g} GiB" if mem >= GIB else f"{mem / 1024**2:.3g} MiB"
    parts = [
        f"At {memory} of KV memory for every arm, {spec.context_tokens} tokens a request, target {spec.target_text()}:"
    ]
    for c in comps:
        label = "A/A control" if c.candidate in aa else c.candidate
        if c.ratio is None:
            parts.append(f"{label}: no ratio ({'; '.join(c.reasons) or 'no finished cells'}).")
            continue
        parts.append(
            f"{label}: {c.users_candidate} vs {c.users_baseline} users within the target (ratio {c.ratio:.2f}"
            + (f", 95 % interval {c.ratio_low:.2f} to {c.ratio_high:.2f}" if c.ratio_low is not None else "")
            + f"), {c.claim}"
            + (f" ({c.reasons[0]})" if c.claim == "no claim" and c.reasons else "")
            + "."
        )
    return " ".join(parts)


open_or_complete = partial(grid.open_or_complete, LoadSpec, run_load, load_capture, "nothing to analyse")
