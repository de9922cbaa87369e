"""Speed verdicts for notebook 02: :func:`kvstudy.speed.verdict.compare_runs` on a capture's cells,
the published table restated under the same rule, the roofline bound beside each change, and the
A/A calibration. The candidate/baseline TPOT ratio ``r``: "faster by X %" is X = (1 - r) x 100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from kvstudy.bench.measurability import assess_run
from kvstudy.bench.spec import Arm
from kvstudy.bench.telemetry import metrics_delta, window_clocks
from kvstudy.capture import model_config
from kvstudy.errors import StudyError
from kvstudy.model.allocator import predict_logged_pool
from kvstudy.model.roofline import max_fp8_gain_pct
from kvstudy.speed import calibration as cal
from kvstudy.speed.spec import Capture
from kvstudy.speed.verdict import (
    CLOCK_TOLERANCE,
    RunSummary,
    Verdict,
    adjust_for_multiplicity,
    compare_runs,
    minimum_p_value,
    summarise_run,
)

# "Well beyond" the bound: the measured change is more than this many times what halving the KV
# bytes can explain (and, when an interval exists, the interval lies beyond the bound too).
BEYOND_FACTOR = 2.0


def change_text(ratio: float | None) -> str:
    """ "faster by X %" / "slower by X %" from a candidate/baseline TPOT ratio."""
    if ratio is None or not math.isfinite(ratio):
        return "no ratio"
    pct = (1.0 - ratio) * 100.0
    return f"faster by {pct:.1f} %" if pct >= 0 else f"slower by {-pct:.1f} %"


def bound_less_time_pct(gain_pct: float) -> float:
    """The roofline's largest speed-up (base/cand - 1, %) as the largest "less time per token" (%)."""
    return (1.0 - 1.0 / (1.0 + gain_pct / 100.0)) * 100.0


# A change the test does not claim is not set against the bound: a point estimate proves nothing there.
NO_CLAIM_AGAINST_BOUND = "no claim: a change the test does not claim is not compared with the bound"


def beyond_bound(ratio: float | None, ci: tuple[float, float] | None, bound_pct: float | None) -> str:
    """What the bound says about a measured change ("" when nothing is to be said)."""
    if ratio is None or bound_pct is None:
        return ""
    less = (1.0 - ratio) * 100.0
    if less < 0:
        return "slower: fewer KV bytes cannot explain a slowdown (FP8 conversion work, or another factor changed)"
    if less > BEYOND_FACTOR * max(bound_pct, 1e-9) and (ci is None or (1.0 - ci[1]) * 100.0 > bound_pct):
        return f"another factor changed: the change is well beyond the {bound_pct:.2f} % that halving KV bytes explains"
    return f"within reach of the {bound_pct:.2f} % bound"


# --------------------------------------------------------------------------- capture runs


def capture_runs(capture: Capture, configuration: str, users: int) -> list[RunSummary]:
    """Per finished cell of ``configuration`` at ``users``, by seed: a RunSummary of its per-request
    records (``capture.grid``), measurability assessed, with its median clock, the range of its clock
    samples in its window, and its start (``started_mono_s``, else the bench window's, on the capture's
    one monotonic clock)."""
    cells = capture.cells
    if not len(cells):
        return []
    sel = cells[(cells["status"] == "ok") & (cells["configuration"] == configuration) & (cells["users"] == users)]
    out = []
    for _, row in sel.sort_values("seed").iterrows():
        cell = capture.grid.cells[row["cell_id"]]
        window, samples, clock = (
            cell.data.get(k) for k in ("bench_window_s", "clock_samples_in_window", "median_clock_mhz")
        )
        duration = float(window[1] - window[0]) if window else None
        # the sampling interval limits what a window holds unless edge samples bracketed the cell's clock window
        bracketed = cell.data.get("clock_window_s") is not None and samples is not None
        interval = cell.data.get("clock_interval_s") or capture.spec.telemetry_interval_s
        m = assess_run(
            cell.requests,
            cell.id,
            expected_output_len=int(capture.spec.output_len),
            duration_s=duration,
            clock_interval_s=None if bracketed else float(interval),
            clock_samples_in_window=samples,
        )
        clocks = window_clocks(cell.telemetry, *(window or (None, None)))
        start = row.get("started_mono_s")
        out.append(
            summarise_run(
                cell.requests,
                m,
                start_time_s=float(start) if pd.notna(start) else float(window[0]) if window else None,
                median_clock_mhz=None if clock is None else float(clock),
                block=int(row["seed"]),
                clock_range_mhz=float(max(clocks) - min(clocks)) if clocks else None,
            )
        )
    return out


def aa_runs(capture: Capture, users: int) -> list[RunSummary]:
    """The runs at ``users`` of the baseline and its A/A repeats (:meth:`UsersSpec.aa_arms`)."""
    names = [capture.spec.configurations[0].name, *capture.spec.aa_arms()]
    return [r for name in names for r in capture_runs(capture, name, users)]


@dataclass
class CaptureVerdict:
    """One baseline/candidate pair at one user count, with the bound beside it."""

    users: int
    baseline: str
    candidate: str
    verdict: Verdict
    bound_pct: float | None  # largest "less time per token" halving KV bytes explains; None: no dtype change
    bound_note: str
    effect: str = ""  # what the pair isolates: "A/A (noise)", "KV dtype", "attention backend", ...


_DIFFERS = {
    "kv_cache_dtype": "KV dtype",
    "attention_backend": "attention backend",
    "env": "environment",
    "extra_args": "extra arguments",
}


def _what_differs(base: Arm, cand: Arm) -> list[str]:
    return [name for field, name in _DIFFERS.items() if getattr(base, field) != getattr(cand, field)]


def comparison_pairs(configurations: list[Arm]) -> list[tuple[str, str, str]]:
    """(baseline, candidate, effect) pairs of a crossed design. Each configuration is compared with
    the first; one that changes the KV dtype and something else is also compared with the
    configuration that has everything of it but the baseline's dtype, which isolates the dtype."""
    base = configurations[0]
    pairs = []
    for c in configurations[1:]:
        diff = _what_differs(base, c)
        effect = (
            "A/A (noise: identical configurations)"
            if not diff
            else " + ".join(diff) + (" together" if len(diff) > 1 else "")
        )
        pairs.append((base.name, c.name, effect))
        if "KV dtype" in diff and len(diff) > 1:
            for d in configurations[1:]:
                if d is not c and _what_differs(d, c) == ["KV dtype"] and d.kv_cache_dtype == base.kv_cache_dtype:
                    where = d.attention_backend or "the default backend"
                    pairs.append((d.name, c.name, f"KV dtype alone (both on {where})"))
                    break
    return pairs


def capture_queueing(capture: Capture) -> dict[int, str]:
    """Per user count whose users need more KV blocks than the held pool: the refusal reason
    (:func:`admission_rows` on the capture's model config); empty when nothing queues or the pool is
    not held in blocks."""
    spec = capture.spec
    if not spec.num_gpu_blocks_override:
        return {}
    device = "cpu" if spec.cpu_kvcache_space_gib is not None else "cuda"
    try:
        model = model_config(capture.path, spec.model).parent
        rows = admission_rows(model, spec.input_len + spec.output_len, spec.users, spec.num_gpu_blocks_override, device)
    except (StudyError, OSError):
        return {}
    return {
        r.users: f"queueing: TPOT includes waiting ({r.waiting} of {r.users} requests wait: {r.users} users need "
        f"{r.blocks_needed:,} blocks, the pool holds {r.pool_blocks:,})"
        for r in rows
        if r.waiting
    }


def capture_verdicts(
    capture: Capture, clock_tolerance: float = CLOCK_TOLERANCE, registered_runs_per_arm: int | None = None
) -> list[CaptureVerdict]:
    """compare_runs for every pair (:func:`comparison_pairs`) per user count (both arms finished),
    within seed blocks, against the registered runs per arm (default: the capture's seed count, fixed
    in its spec before the runs), refused where the users queue; then Holm over all of them."""
    spec = capture.spec
    context = spec.input_len + spec.output_len
    registered = registered_runs_per_arm if registered_runs_per_arm is not None else len(spec.seeds)
    queueing = capture_queueing(capture)
    out = []
    for base, cand, effect in comparison_pairs(spec.configurations):
        for users in spec.users:
            runs = capture_runs(capture, base, users), capture_runs(capture, cand, users)
            if not all(runs):
                continue
            refusals = [queueing[users]] if users in queueing else []
            v = compare_runs(
                *runs, clock_tolerance=clock_tolerance, registered_runs_per_arm=registered, refusals=refusals
            )
            bound, note = None, "same KV dtype in both arms: halving KV bytes plays no part"
            if spec.arm(cand).kv_cache_dtype != spec.arm(base).kv_cache_dtype:
                try:
                    config = model_config(capture.path, spec.model)
                    bound = bound_less_time_pct(max_fp8_gain_pct(config.parent, context, users))
                    note = (
                        f"roofline, computed from {config} at {context} tokens x "
                        f"{users} user(s); bandwidth cancels, so no bandwidth figure is needed"
                    )
                except (StudyError, OSError) as exc:
                    note = f"not computed: the model's config.json could not be read here ({exc})"
            out.append(CaptureVerdict(users, base, cand, v, bound, note, effect))
    adjusted = adjust_for_multiplicity([cv.verdict for cv in out])
    return [replace(cv, verdict=v) for cv, v in zip(out, adjusted)]


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted, or "" where it is missing or not finite."""
    return "" if x is None or not math.isfinite(x) else format(x, spec)


# --------------------------------------------------------------------------- the published table


def published_model_dir(pub: Any) -> Path:
    """The bundled model folder of the published table's model (``data/models/<name>``)."""
    return Path(pub.path).parents[1] / "models" / str(pub.meta["model"]).split("/")[-1]


@dataclass(frozen=True)
class Consistency:
    """One published row: the decode streams its own figures imply (output tok/s x median TPOT)."""

    users: int
    configuration: str
    output_tok_s: float
    median_tpot_ms: float
    implied_streams: float  # rounded to 2 decimals
    context_len: int
    requests_that_fit: int
    check: str  # "consistent", or "contradiction: ..." with the figures that contradict


def published_consistency(pub: Any, context_len: int) -> list[Consistency]:
    """Per published row: the decode streams its figures imply (output tok/s x median TPOT) against the
    users and the requests of ``context_len`` tokens the pool holds; more contradicts that length."""
    block = int(pub.meta.get("block_size") or 16)
    blocks = int(pub.meta["pool_blocks"])
    fit = blocks // -(-int(context_len) // block)
    rows = []
    for _, r in pub.table.sort_values(["users", "configuration"]).iterrows():
        tok_s, tpot = float(r["output_throughput_tok_s"]), float(r["median_tpot_ms"])
        implied = tok_s * tpot / 1e3
        users = int(r["users"])
        longest = (blocks // math.ceil(implied)) * block if implied <= users else None
        if implied > users * 1.02:
            check = (
                f"contradiction: {implied:.2f} streams from {users} user(s) (tok/s and TPOT describe other requests)"
            )
        elif implied > fit:
            check = (
                f"contradiction: {implied:.1f} streams, but only {fit} requests of {context_len:,} tokens fit "
                f"(at most {longest:,} tokens per request would let {math.ceil(implied)} fit)"
            )
        else:
            check = "consistent"
        rows.append(
            Consistency(users, r["configuration"], tok_s, tpot, round(implied, 2), int(context_len), fit, check)
        )
    return rows


def _length_contradicted(pub: Any, context_len: int) -> str:
    r = next((r for r in published_consistency(pub, context_len) if r.check != "consistent" and r.users > 1), None)
    if r is None:
        return ""
    return (
        f"the request length was not published, and the {context_len:,} tokens assumed are contradicted by "
        f"the published throughput ({r.implied_streams:.1f} streams implied at {r.users} "
        f"users, only {r.requests_that_fit} such requests fit)"
    )


@dataclass(frozen=True)
class PublishedVerdict:
    """One user count of the published table restated under the new rule (no test: no per-run values)."""

    users: int
    tpot_ms: tuple[float, float]  # baseline, candidate (published medians)
    seeds: tuple[int, int]  # baseline, candidate
    tpot_ratio: float  # candidate / baseline
    min_p_value: float  # the design's smallest reachable p
    clock_ratio: float
    cycles_per_token: tuple[float, float]  # baseline, candidate
    context_len: int  # tokens per request assumed for the bound
    bound_pct: float | None  # None: no config.json to compute it from
    contradicted: str  # why the assumed request length is contradicted ("" when it is not)
    reasons: tuple[str, ...]
    verdict: str = "no claim"


def published_verdicts(pub: Any, context_len: int, clock_tolerance: float = CLOCK_TOLERANCE) -> list[PublishedVerdict]:
    """The published per-configuration medians restated under the new rule (no per-run values exist,
    so no test can be run: the design's smallest reachable p decides), clocks, cycles and the bound
    at the assumed request length, which makes no claim when the published figures contradict it."""
    base, cand = pub.meta["baseline"], pub.meta["candidate"]
    # the project's copy of the published model's config.json (data/models/<name>, beside data/published)
    model_dir = published_model_dir(pub)
    contradicted = _length_contradicted(pub, context_len)
    rows = []
    for users, at in pub.table.groupby("users"):
        at = at.set_index("configuration")
        if base not in at.index or cand not in at.index:
            continue
        b, c = at.loc[base], at.loc[cand]
        tb, tc, cb, cc = (float(x[k]) for k in ("median_tpot_ms", "median_clock_mhz") for x in (b, c))
        seeds = (int(b["seeds"]), int(c["seeds"]))
        min_p = minimum_p_value(*seeds)
        reasons = []
        if min_p >= 0.05:
            reasons.append(
                f"no claim, the design cannot reach significance: {seeds[0]} vs {seeds[1]} seeds, smallest "
                f"two-sided p of an exact test is {min_p:.2g}"
            )
        reasons.append("per-seed values were not published: no test, no interval")
        if abs(cc / cb - 1.0) > clock_tolerance:
            reasons.append(f"clocks differ by {cc / cb - 1:+.1%} ({cb:.0f} vs {cc:.0f} MHz)")
        has_config = (model_dir / "config.json").is_file()
        bound = bound_less_time_pct(max_fp8_gain_pct(model_dir, context_len, int(users))) if has_config else None
        cycles = (tb * 1e-3 * cb * 1e6, tc * 1e-3 * cc * 1e6)
        why = tuple(reasons)
        rows.append(
            PublishedVerdict(
                int(users), (tb, tc), seeds, tc / tb, min_p, cc / cb, cycles, context_len, bound, contradicted, why
            )
        )
    return rows


# --------------------------------------------------------------------------- pool admission


@dataclass(frozen=True)
class Admission:
    """One user count: the KV blocks its requests need at once against the pool's blocks."""

    users: int
    context_len: int
    blocks_per_request: int
    block_size: int
    pool_blocks: int
    origin: str
    blocks_needed: int
    requests_that_fit: int
    waiting: int  # requests that wait in vLLM's queue (0 when every user's request fits)


def admission_rows(
    model: str | Path, context_len: int, users: list[int], num_blocks: int, device: str = "cuda"
) -> list[Admission]:
    """Per user count: the KV blocks the users' requests need at once against the pool's (vLLM's block
    rules): beyond it the rest wait in vLLM's queue, and TPOT measures queueing too."""
    pool = predict_logged_pool(model, "auto", 1, int(context_len), num_blocks_override=num_blocks, device=device)
    origin = f"computed from {model}/config.json with vLLM 0.32's block rules (model/allocator.py), {device} block size"
    per, fit = pool.blocks_per_request, num_blocks // pool.blocks_per_request
    return [
        Admission(u, int(context_len), per, pool.block_size, num_blocks, origin, u * per, fit, max(0, u - fit))
        for u in users
    ]


def server_metrics_frame(capture: Capture) -> pd.DataFrame:
    """Per finished cell: preemptions and mean queue time during the cell, from vLLM's /metrics read
    before and after it (empty when the capture predates this or the server exposed none)."""
    rows = []
    for cell in capture.grid.cells.values():
        delta = metrics_delta(cell.data.get("server_metrics_before"), cell.data.get("server_metrics_after"))
        if not cell.ok or not delta:
            continue
        rows.append(
            {
                "cell": cell.id,
                "users": int(cell.data["users"]),
                "preemptions": delta.get("preemptions"),
                "mean queue time (ms)": (
                    None if "mean_queue_time_s" not in delta else delta["mean_queue_time_s"] * 1e3
                ),
                "requests counted (warm-ups included)": delta.get("requests_seen"),
                "origin": "vLLM /metrics (vllm:num_preemptions, vllm:request_queue_time_seconds) before/after the cell",
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- A/A calibration


def calibration_frame(capture: Capture, n_per_arm: int = 6, change: float = 0.2) -> pd.DataFrame:
    """Per user count, from the capture's A/A runs (seed blocks): false-claim rates over real splits
    and resampled designs, power for ``change`` and its range over the noise, the 80 % power change."""
    rows = []
    for users in capture.spec.users:
        runs = aa_runs(capture, users)
        usable = [r for r in runs if r.measurable and r.tpots_s]
        row: dict[str, Any] = {"users": users}
        if len(usable) < 2:
            why = sorted({reason.split(":")[0] for r in runs if not r.measurable for reason in r.unmeasurable_reasons})
            row["A/A runs"] = f"{len(usable)} measurable of {len(runs)}"
            row["false claims, real splits"] = "not computed: fewer than 2 measurable A/A runs" + (
                f" (not measured: {'; '.join(why)})" if why else ""
            )
        else:
            blocks = cal.seed_blocks(usable)
            pw = cal.power(usable, change=change, n_per_arm=n_per_arm)
            sens = cal.noise_sensitivity(usable, change=change, n_per_arm=n_per_arm)
            mdc = cal.minimum_detectable_change(usable, n_per_arm=n_per_arm, simulations=200)
            row |= {
                "A/A runs": f"{len(usable)} in {len(blocks)} seed blocks" if blocks else len(usable),
                "false claims, real splits": cal.false_claim_rate(usable).text,
                f"false claims, {n_per_arm} blocks per arm resampled": cal.power(
                    usable, change=0.0, n_per_arm=n_per_arm
                ).text,
                f"power for {change:+.0%}, {n_per_arm} blocks per arm": pw.text
                if not pw.trials
                else f"{pw.rate:.0%} (95 % interval {pw.ci_95[0]:.0%} to {pw.ci_95[1]:.0%}, {pw.trials} designs)",
                "power across the noise estimate's uncertainty": sens.text if sens else "not estimable",
                f"80 % power from ({n_per_arm} blocks per arm)": "none up to 300 %"
                if mdc is None
                else f"slower by {mdc * 100:.1f} %",
            }
        rows.append(row | {"origin": "computed here from the capture's A/A cells (calibration.py), seed as a block"})
    return pd.DataFrame(rows)


def finding_text(published: list[PublishedVerdict], measured: list[CaptureVerdict], machine: str) -> str:
    """One line from the verdicts: the published table under the new rule, then this capture."""
    # each with its first reason's head, without repeating the verdict ("no claim, the design ..." -> "the design ...")
    parts = [
        f"L4 published, {r.users} user(s): FP8 {change_text(r.tpot_ratio)} per token, {r.verdict}"
        + (f" ({r.reasons[0].split(':')[0].strip().removeprefix(r.verdict).lstrip(' ,')})" if r.reasons else "")
        for r in published
    ]
    for cv in measured:
        v = cv.verdict
        what = (
            f"{cv.candidate} {change_text(v.tpot_ratio)} per token than {cv.baseline}"
            if v.verdict != "no claim"
            else f"{cv.candidate} vs {cv.baseline}: no claim ({change_text(v.tpot_ratio)}, p = "
            f"{fmt(v.p_value, '.2g') or 'n/a'}, min reachable p {v.min_p_value:.2g})"
        )
        parts.append(f"{machine}, {cv.users} user(s): {what}")
    return "; ".join(parts) if parts else "no comparable cells"
