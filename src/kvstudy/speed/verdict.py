"""A speed verdict with a known false-claim rate: baseline vs candidate TPOT over whole runs.

The unit of replication is the run (requests of one run share its state), summarised by the log of
its median per-request TPOT. Effect: ``tpot_ratio``, candidate / baseline geometric means of the run
medians. Test: the exact permutation test of ``kvstudy.stats.permutation``, within seed blocks when
every run names its seed. Interval: a hierarchical bootstrap (``kvstudy.stats.permutation``), which
with few runs is too narrow: the permutation p guards against false claims.

A claim needs every run measurable, p < alpha, the interval excluding 1, comparable clocks, a block
design in time (:func:`order_check`, or a drift bounded by :func:`kvstudy.stats.permutation.drift_check`),
the registered runs per arm and no outside refusal; :func:`adjust_for_multiplicity` then applies Holm
over one report's tests. Otherwise "no claim", with the reasons.

The permutation test's <= 5 % false-claim guarantee is for a design fixed in advance and tested once:
:func:`order_check` accepts only block designs (one run per arm per seed, a block's runs adjacent in
time, blocks balanced in which arm runs first), since a nearly grouped order confounds drift with the
arm; blocks all starting with the same arm pass only where the verdict bounds the drift;
:func:`registration_check` refuses a verdict on fewer or more runs than registered per arm (testing
after each added seed raises the false-claim rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvstudy.bench.measurability import Measurability, per_request_e2e_per_token_s, per_request_tpot_s
from kvstudy.bench.result import RequestRecord
from kvstudy.errors import StudyError
from kvstudy.stats.binary import MULTIPLICITY_METHOD, holm
from kvstudy.stats.permutation import (
    CONFIDENCE,
    PermutationTest,
    blocks_needed,
    bootstrap_ratio_interval,
    drift_check,
    minimum_p_value,
    permutation_test,
    runs_per_arm_needed,
)

ALPHA = 0.05  # false-claim rate the test is built for
CLOCK_TOLERANCE = 0.05  # arm median clocks may differ by this fraction before a claim is refused


@dataclass(frozen=True)
class RunSummary:
    """One run as the verdict sees it: its per-request TPOTs and what is known about it."""

    name: str
    tpots_s: tuple[float, ...]
    measurable: bool = True
    unmeasurable_reasons: tuple[str, ...] = ()
    start_time_s: float | None = None
    median_clock_mhz: float | None = None
    e2e_per_token_s: tuple[float, ...] = ()
    block: int | None = None  # the seed: both arms' runs of one seed form a block
    clock_range_mhz: float | None = None  # max - min of the clock samples in the run's window

    @property
    def median_tpot_s(self) -> float:
        """Median per-request TPOT (NaN when the run has none)."""
        return float(np.median(self.tpots_s)) if self.tpots_s else math.nan


@dataclass(frozen=True)
class Verdict:
    """Baseline vs candidate TPOT: the claim, the figures behind it and the reasons in words."""

    verdict: str  # "faster" | "slower" | "no claim"
    measurable: bool
    tpot_ratio: float | None  # candidate / baseline, ratio of geometric means of run medians
    tpot_ratio_ci: tuple[float, float] | None
    p_value: float | None
    min_p_value: float
    runs: dict[str, int]
    reasons: list[str] = field(default_factory=list)
    baseline_tpot_ms: float | None = None  # geometric mean of per-run median TPOTs
    candidate_tpot_ms: float | None = None
    clock_ratio: float | None = None  # candidate / baseline median clock
    cycles_per_token: dict[str, float] | None = None  # TPOT x median clock, per arm (cycles)
    clock_adjusted_ratio: float | None = None  # the TPOT ratio had the clocks been equal
    e2e_per_token_ratio: float | None = None  # end-to-end latency per output token, candidate / baseline
    clock_status: str = "not recorded"  # "compared" | "not recorded" | "not varied / not measured" | "missing"
    blocks: int = 0  # seed blocks the test permuted within (0: unblocked)
    order_design: str = "unknown"  # what order_check found
    registered_runs_per_arm: int | None = None
    p_adjusted: float | None = None  # after the multiplicity correction (None: not adjusted)
    family_size: int = 1  # tests in the family the correction ran over
    multiplicity: str = ""  # the correction's method

    # --------------------------------------------------------------------------- inputs


def summarise_run(records: Sequence[RequestRecord], m: Measurability, **known: Any) -> RunSummary:
    """A :class:`RunSummary` from a run's per-request records, their :func:`assess_run` and what else is
    ``known`` of the run (``start_time_s``, ``median_clock_mhz``, ``block``, ``clock_range_mhz``)."""
    return RunSummary(
        name=m.run,
        tpots_s=tuple(float(x) for x in per_request_tpot_s(records)),
        measurable=m.measurable,
        unmeasurable_reasons=tuple(m.reasons),
        e2e_per_token_s=tuple(float(x) for x in per_request_e2e_per_token_s(records)),
        **known,
    )


def _geomean(values: Sequence[float]) -> float:
    return math.exp(np.mean(np.log(values)))


# --------------------------------------------------------------------------- the design


UNBALANCED = "blocks unbalanced"  # adjacent one-per-arm blocks, most starting with the same arm
DRIFT_BOUNDED = "alternating, drift estimated and bounded"


@dataclass(frozen=True)
class OrderCheck:
    """Whether a pair's run order lets the test tell drift from the effect."""

    accepted: bool | None  # None: start times not known
    design: str  # "blocked, balanced (ABBA)" / "nearly grouped" / ...
    reason: str  # empty when accepted


def registration_check(n_base: int, n_cand: int, registered: int | None) -> str:
    """ "" when the runs match the registered number per arm (or none was registered); else the reason."""
    if registered is not None and min(n_base, n_cand) < registered:
        return (
            f"incomplete design, no claim: {n_base} baseline and {n_cand} candidate runs of the "
            f"{registered} per arm registered before the runs"
        )
    if registered is not None and max(n_base, n_cand) > registered:
        return (
            f"more runs than the {registered} per arm registered ({n_base} / {n_cand}): a design grown "
            "until it reaches p < alpha does not keep the 5 % guarantee, no claim"
        )
    return ""


def order_check(
    base_starts: Sequence[float | None],
    cand_starts: Sequence[float | None],
    base_blocks: Sequence[int | None] | None = None,
    cand_blocks: Sequence[int | None] | None = None,
) -> OrderCheck:
    """Accept a block design (one run per arm per block, a block's runs adjacent in time, blocks
    balanced in which arm runs first); refuse any other order, nearly grouped ones included.

    With seeds known (``*_blocks``) the blocks are the seeds; without, consecutive pairs in time."""
    starts = [*base_starts, *cand_starts]
    if None in starts or not base_starts or not cand_starts:
        return OrderCheck(None, "unknown", "run start times not known: the run order cannot be checked")
    bs, cs = [float(t) for t in base_starts if t is not None], [float(t) for t in cand_starts if t is not None]
    if max(bs) < min(cs) or max(cs) < min(bs):
        first = "baseline" if max(bs) < min(cs) else "candidate"
        return OrderCheck(
            False,
            "grouped",
            f"every {first} run started before every other run: the arms were not interleaved in time, "
            "so drift cannot be told from the effect",
        )

    labels = [*(base_blocks or ()), *(cand_blocks or ())]
    known = base_blocks is not None and cand_blocks is not None and None not in labels
    if not known and len(bs) != len(cs):
        return OrderCheck(False, "unbalanced", f"{len(bs)} vs {len(cs)} runs: not a block design")
    runs = sorted(zip([*bs, *cs], "b" * len(bs) + "c" * len(cs), labels if known else [*bs, *cs]))
    arms = [arm for _, arm, _ in runs]
    seq = [blk for _, _, blk in runs] if known else [i // 2 for i in range(len(runs))]
    firsts = []
    for blk in dict.fromkeys(seq):
        where = [i for i, x in enumerate(seq) if x == blk]
        mine = sorted(arms[i] for i in where)
        if mine != ["b", "c"] and not known:
            order = "".join("A" if arm == "b" else "B" for arm in arms)
            return OrderCheck(
                False,
                "nearly grouped",
                f"run order {order} (A baseline, B candidate) is not a sequence of AB/BA blocks: an order "
                "this close to grouped confounds drift with the arm",
            )
        if mine != ["b", "c"]:
            return OrderCheck(
                False,
                "unblocked",
                f"seed {blk} has {mine.count('b')} baseline and {mine.count('c')} candidate run(s), "
                "not one of each: not a block design",
            )
        if where[-1] - where[0] != 1:
            return OrderCheck(
                False,
                "blocks split in time",
                f"the two runs of seed {blk} are not adjacent in time (other seeds ran between them): "
                "drift between them is not removed by the block",
            )
        firsts.append(arms[where[0]])
    n_b = firsts.count("b")
    if abs(n_b - (len(firsts) - n_b)) > 1:
        return OrderCheck(
            False,
            UNBALANCED,
            f"the baseline ran first in {n_b} of {len(firsts)} blocks: a drift within blocks would not cancel "
            "(ABBA or balanced randomized blocks expected)",
        )
    return OrderCheck(True, "blocked, balanced (ABBA)", "")


# --------------------------------------------------------------------------- the verdict


def statistical_claim(p_value: float, interval: tuple[float, float] | None, ratio: float) -> str:
    """The test's part of the rule alone: a direction when p < ALPHA and the interval excludes 1."""
    if interval is None or not p_value < ALPHA or interval[0] <= 1.0 <= interval[1]:
        return "no claim"
    return "faster" if ratio < 1.0 else "slower"


def _clock_part(
    base: Sequence[RunSummary], cand: Sequence[RunSummary], ratio: float | None, tolerance: float, reasons: list[str]
) -> tuple[bool, dict[str, Any]]:
    """Whether the clocks allow a claim, and the :class:`Verdict`'s clock fields."""
    runs = (*base, *cand)
    clocks = [r.median_clock_mhz for r in runs]
    if all(c is None for c in clocks):
        reasons.append("clocks were not recorded: the comparison assumes both arms ran at the same clock")
        return True, {"clock_status": "not recorded"}
    missing = [r.name for r in runs if r.median_clock_mhz is None or not r.median_clock_mhz > 0]
    if missing:
        reasons.append(f"no median clock for run(s) {', '.join(missing)}: clocks cannot be compared")
        return False, {"clock_status": "missing"}
    flat = all(r.clock_range_mhz is None or r.clock_range_mhz == 0 for r in runs)
    if len(runs) > 1 and len(set(clocks)) == 1 and flat:
        reasons.append(
            f"clock not varied / not measured: every run read {clocks[0]:g} MHz; a constant reading is not "
            "a measurement of an equal clock (this machine may not report its frequency), so no clock "
            "ratio or cycles per token is given"
        )
        return True, {"clock_status": "not varied / not measured"}
    cb = _geomean([r.median_clock_mhz for r in base])  # type: ignore[misc]
    cc = _geomean([r.median_clock_mhz for r in cand])  # type: ignore[misc]
    clock_ratio = cc / cb
    ok = abs(clock_ratio - 1.0) <= tolerance
    if not ok:
        reasons.append(
            f"clocks differ by {clock_ratio - 1.0:+.1%} (baseline {cb:.0f} MHz, candidate {cc:.0f} MHz), "
            f"more than the {tolerance:.0%} tolerance"
        )
    cycles = adjusted = None
    if ratio is not None and all(r.tpots_s for r in runs):
        cycles = {
            label: _geomean([r.median_tpot_s * r.median_clock_mhz * 1e6 for r in arm])  # type: ignore[operator]
            for label, arm in (("baseline", base), ("candidate", cand))
        }
        adjusted = cycles["candidate"] / cycles["baseline"]
        reasons.append(
            f"cycles per token (TPOT x median clock): baseline {cycles['baseline'] / 1e6:.3g} M, "
            f"candidate {cycles['candidate'] / 1e6:.3g} M, ratio {adjusted:.3f} (the TPOT ratio times the "
            "clock ratio: arithmetic on the readings, not the effect of the candidate's setting, which "
            "may itself change the clock)"
        )
    return ok, {
        "clock_status": "compared",
        "clock_ratio": clock_ratio,
        "cycles_per_token": cycles,
        "clock_adjusted_ratio": adjusted,
    }


def compare_runs(
    base: Sequence[RunSummary],
    cand: Sequence[RunSummary],
    *,
    clock_tolerance: float = CLOCK_TOLERANCE,
    registered_runs_per_arm: int | None = None,
    refusals: Sequence[str] = (),
) -> Verdict:
    """The verdict on candidate vs baseline TPOT from per-run summaries (see the module text).

    ``registered_runs_per_arm``: the runs per arm fixed before the runs (a verdict on another number
    is "no claim"); ``refusals``: reasons from outside the runs (e.g. queueing) that refuse a claim."""
    if not base or not cand:
        raise StudyError(f"verdict: {len(base)} baseline and {len(cand)} candidate runs, expected at least 1 each")
    runs = (*base, *cand)
    registration = registration_check(len(base), len(cand), registered_runs_per_arm)
    unmeasured = [
        f"run {r.name}: per-token latency not measured ({'; '.join(r.unmeasurable_reasons)})"
        for r in runs
        if not r.measurable
    ]
    reasons = [*refusals, *filter(None, [registration]), *unmeasured]
    measurable = not unmeasured
    allowed = not refusals and not registration and measurable
    blocks = [[r.block for r in arm] for arm in (base, cand)]
    blocked = None not in (*blocks[0], *blocks[1]) and bool(set(blocks[0]) & set(blocks[1]))
    bb, cb = blocks if blocked else (None, None)

    e2e_ratio = None
    if all(r.e2e_per_token_s for r in runs):
        e2e = [[float(np.median(r.e2e_per_token_s)) for r in arm] for arm in (base, cand)]
        if all(v > 0 for arm in e2e for v in arm):
            e2e_ratio = _geomean(e2e[1]) / _geomean(e2e[0])

    medians_ok = all(r.tpots_s and r.median_tpot_s > 0 for r in runs)
    ratio = ci = p = base_ms = cand_ms = None
    test: PermutationTest | None = None
    min_p = minimum_p_value(len(base), len(cand))
    if medians_ok:
        lb = [math.log(r.median_tpot_s) for r in base]
        lc = [math.log(r.median_tpot_s) for r in cand]
        test = permutation_test(lb, lc, base_blocks=bb, cand_blocks=cb)  # type: ignore[arg-type]
        min_p = test.min_p_value
        ratio, p = math.exp(np.mean(lc) - np.mean(lb)), test.p_value
        base_ms, cand_ms = math.exp(np.mean(lb)) * 1e3, math.exp(np.mean(lc)) * 1e3
        ci = bootstrap_ratio_interval([r.tpots_s for r in base], [r.tpots_s for r in cand])
        kind = f"exact over all {test.splits} splits" if test.exact else f"Monte-Carlo, {test.splits} random splits"
        where = f"within {test.blocks} seed blocks" if test.blocks else "unblocked: seeds not known"
        reasons.append(
            f"TPOT ratio {ratio:.3f} (candidate {cand_ms:.3g} ms / baseline {base_ms:.3g} ms), "
            f"{CONFIDENCE:.0%} interval [{ci[0]:.3f}, {ci[1]:.3f}], p = {p:.3g} "
            f"(permutation test {where}, {kind})"
        )
        if not p < ALPHA:
            reasons.append(f"p = {p:.3g} is not below alpha = {ALPHA:g}")
        if ci[0] <= 1.0 <= ci[1]:
            reasons.append(f"the {CONFIDENCE:.0%} interval includes 1 (no change)")
    else:
        allowed = False
        reasons.append("a run has no positive median TPOT: no TPOT ratio can be computed")
        if e2e_ratio is not None:
            reasons.append(
                f"end-to-end latency per output token (first token included, not a TPOT), "
                f"candidate / baseline: {e2e_ratio:.3f}"
            )
    if min_p >= ALPHA:
        allowed = False
        need = (
            f"a blocked exact test needs at least {blocks_needed(ALPHA)} seeds (one run per arm each)"
            if blocked
            else f"an exact test needs at least {runs_per_arm_needed(ALPHA)} runs per arm"
        )
        reasons.append(
            f"the design cannot reach significance: with {len(base)} vs {len(cand)} runs"
            f"{' in seed blocks' if blocked else ''} the smallest possible two-sided p is {min_p:.3g}, "
            f"not below alpha = {ALPHA:g}; {need}"
        )

    starts = ([r.start_time_s for r in base], [r.start_time_s for r in cand])
    order = order_check(*starts, bb, cb)
    drift = None
    if order.design == UNBALANCED and medians_ok:  # adjacent blocks, same arm first: bound the drift
        drift = drift_check(lb, lc, *starts, alpha=ALPHA)  # type: ignore[arg-type]
        if drift.cleared:
            order = replace(order, accepted=True, design=DRIFT_BOUNDED, reason="")
    if not order.accepted:
        allowed = False
        reasons.append(order.reason)
    if drift is not None:
        reasons.append(drift.reason)

    clocks_ok, clock = _clock_part(base, cand, ratio, clock_tolerance, reasons)
    allowed = allowed and clocks_ok

    verdict = statistical_claim(p, ci, ratio) if allowed and ratio is not None and p is not None else "no claim"
    if verdict != "no claim":
        word = "less" if verdict == "faster" else "more"
        reasons.insert(0, f"the candidate spends {abs(1.0 - ratio):.1%} {word} time per output token")  # type: ignore[operator]
    return Verdict(
        verdict=verdict,
        measurable=measurable,
        tpot_ratio=ratio,
        tpot_ratio_ci=ci,
        p_value=p,
        min_p_value=min_p,
        runs={"baseline": len(base), "candidate": len(cand)},
        reasons=reasons,
        baseline_tpot_ms=base_ms,
        candidate_tpot_ms=cand_ms,
        e2e_per_token_ratio=e2e_ratio,
        blocks=test.blocks if test else 0,
        order_design=order.design,
        registered_runs_per_arm=registered_runs_per_arm,
        **clock,
    )


def adjust_for_multiplicity(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Holm's correction over the tests of one report (those with a p value): each verdict gets its
    adjusted p; a claim whose adjusted p is not below :data:`ALPHA` becomes "no claim"."""
    tested = [i for i, v in enumerate(verdicts) if v.p_value is not None]
    adjusted = holm([verdicts[i].p_value for i in tested])  # type: ignore[misc]
    m = len(tested)
    out = list(verdicts)
    for i, q in zip(tested, adjusted):
        v = verdicts[i]
        reasons = list(v.reasons)
        verdict = v.verdict
        best = min(1.0, m * v.min_p_value)
        if m > 1 and best >= ALPHA:
            reasons.append(
                f"after Holm's correction over the {m} tests of this report the smallest reachable "
                f"adjusted p is {best:.3g} ({m} x {v.min_p_value:.3g}), not below alpha = {ALPHA:g}"
            )
        if verdict != "no claim" and not q < ALPHA:
            verdict = "no claim"
            reasons = [r for r in reasons if not r.startswith("the candidate spends")]
            reasons.append(
                f"Holm-adjusted p = {q:.3g} over the {m} tests of this report is not below alpha = {ALPHA:g}"
            )
        out[i] = replace(
            v, verdict=verdict, reasons=reasons, p_adjusted=q, family_size=m, multiplicity=MULTIPLICITY_METHOD
        )
    return out
