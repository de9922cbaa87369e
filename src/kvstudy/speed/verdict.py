"""A speed verdict with a known false-claim rate: baseline vs candidate TPOT over whole runs.

The unit of replication is the run (one server start and bench, or one sweep cell): requests in
one run share the run's state (load on the machine, clock, memory layout), so they are not
independent replicates. Per run the summary is the log of its median per-request TPOT.

* **Effect:** ``tpot_ratio`` = candidate / baseline, the ratio of the geometric means of the
  per-run median TPOTs (exp of the difference of mean log medians). Below 1: the candidate spends
  less time per output token ("faster").
* **Test:** an exact permutation test of that difference over all C(n1+n2, n1) ways to split the
  runs into two arms of the same sizes (a seeded Monte-Carlo of :data:`MONTE_CARLO_DRAWS` splits
  when there are more than :data:`MAX_EXACT_SPLITS`). Two-sided p = min(1, 2 x the smaller one-sided
  p), so the smallest p a design can reach is 2 / C(n1+n2, n1): 0.2 at 3 vs 2 runs, 0.1 at 3 vs 3,
  0.029 at 4 vs 4. Under "no difference" (runs exchangeable) P(p < alpha) <= alpha exactly.
* **Interval:** a 95 % percentile interval of the ratio from a hierarchical bootstrap (resample runs
  within each arm, then requests within each drawn run). With few runs it is too narrow (it sees
  only the runs it has); the permutation p is the guard on false claims, the interval says how large.

A claim ("faster" or "slower") needs: every run measurable; p < alpha; the interval excluding 1;
clocks comparable when known (arm medians within ``clock_tolerance``); and the arms interleaved in
time (when every run of one arm started before every run of the other, drift cannot be told from
the effect). Otherwise the verdict is "no claim", with the reasons.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstudy.bench.measurability import (
    Measurability,
    RunRequests,
    assess_run,
    per_request_e2e_per_token_s,
    per_request_tpot_s,
)
from kvstudy.errors import StudyError

ALPHA = 0.05  # false-claim rate the test is built for
CONFIDENCE = 0.95  # level of the reported interval
CLOCK_TOLERANCE = 0.05  # arm median clocks may differ by this fraction before a claim is refused
MAX_EXACT_SPLITS = 20_000  # enumerate all splits up to this many (C(16, 8) = 12,870)
MONTE_CARLO_DRAWS = 20_000  # random splits otherwise (>= 10,000 keeps the p-value's own error < 0.005)
BOOTSTRAP_RESAMPLES = 2_000  # hierarchical bootstrap draws for the interval
_TIE_TOL = 1e-12  # statistics this close to the observed one count as ties (float sums)

VERDICTS = ("faster", "slower", "no claim")


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

    @property
    def median_tpot_s(self) -> float:
        """Median per-request TPOT (NaN when the run has none)."""
        return float(np.median(self.tpots_s)) if self.tpots_s else math.nan


@dataclass(frozen=True)
class PermutationTest:
    """Result of the permutation test on per-run values (candidate minus baseline means)."""

    statistic: float
    p_value: float
    exact: bool
    splits: int  # splits evaluated (all of them when exact)
    min_p_value: float  # smallest two-sided p the design can reach


@dataclass(frozen=True)
class Verdict:
    """Baseline vs candidate TPOT: the claim, the figures behind it and the reasons in words."""

    verdict: str  # "faster" | "slower" | "no claim"
    measurable: bool
    tpot_ratio: float | None  # candidate / baseline, ratio of geometric means of run medians
    tpot_ratio_ci: tuple[float, float] | None
    p_value: float | None
    min_p_value: float
    alpha: float
    runs: dict[str, int]
    reasons: list[str] = field(default_factory=list)
    exact: bool = True
    splits: int = 0
    baseline_tpot_ms: float | None = None  # geometric mean of per-run median TPOTs
    candidate_tpot_ms: float | None = None
    interleaved: bool | None = None
    clock_ratio: float | None = None  # candidate / baseline median clock
    cycles_per_token: dict[str, float] | None = None  # TPOT x median clock, per arm (cycles)
    clock_adjusted_ratio: float | None = None  # the TPOT ratio had the clocks been equal
    e2e_per_token_ratio: float | None = None  # end-to-end latency per output token, candidate / baseline
    ratio_method: str = "ratio of geometric means of per-run median TPOT (candidate / baseline)"
    test_method: str = "permutation test on log median TPOT per run, two-sided (2 x smaller one-sided p)"
    interval_method: str = "hierarchical bootstrap (runs within arm, then requests within run), percentile"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tuples as lists)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if self.tpot_ratio_ci is not None:
            out["tpot_ratio_ci"] = list(self.tpot_ratio_ci)
        return out


# --------------------------------------------------------------------------- the test


def minimum_p_value(n_base: int, n_cand: int) -> float:
    """Smallest two-sided p the exact permutation test can give with these arm sizes: 2 / C(n1+n2, n1)."""
    if n_base < 1 or n_cand < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_base + n_cand, n_base))


def runs_needed(alpha: float = ALPHA) -> int:
    """Fewest runs per arm (equal arms) with which an exact test can reach p < ``alpha``."""
    n = 1
    while minimum_p_value(n, n) >= alpha:
        n += 1
    return n


@functools.lru_cache(maxsize=32)
def _split_matrix(total: int, n_cand: int) -> np.ndarray:
    """All ways to choose the candidate arm's positions: a (C(total, n_cand), total) 0/1 matrix."""
    combos = np.array(list(itertools.combinations(range(total), n_cand)), dtype=np.intp)
    mat = np.zeros((len(combos), total), dtype=np.float64)
    mat[np.repeat(np.arange(len(combos)), n_cand), combos.ravel()] = 1.0
    mat.setflags(write=False)
    return mat


def permutation_test(
    base: Sequence[float],
    cand: Sequence[float],
    *,
    seed: int = 0,
    max_exact: int = MAX_EXACT_SPLITS,
    draws: int = MONTE_CARLO_DRAWS,
) -> PermutationTest:
    """Permutation test of mean(cand) - mean(base) on per-run values (e.g. log median TPOT).

    Exact over all splits when there are at most ``max_exact``; otherwise ``draws`` random splits
    (seeded), each one-sided p as (1 + hits) / (1 + draws). Two-sided p = min(1, 2 x smaller side).
    """
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    if b.size < 1 or c.size < 1:
        raise StudyError(f"permutation test: {b.size} baseline and {c.size} candidate runs, expected at least 1 each")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        raise StudyError("permutation test: per-run values must be finite (a run with zero TPOT?)")
    values = np.concatenate([b, c])
    n1, n2, total = b.size, c.size, b.size + c.size
    observed = c.mean() - b.mean()
    splits = math.comb(total, n2)
    if splits <= max_exact:
        cand_sum = _split_matrix(total, n2) @ values
        stats = cand_sum / n2 - (values.sum() - cand_sum) / n1
        tol = _TIE_TOL * max(1.0, float(np.abs(values).max()))
        upper = np.count_nonzero(stats >= observed - tol) / splits
        lower = np.count_nonzero(stats <= observed + tol) / splits
        exact, evaluated = True, splits
    else:
        rng = np.random.default_rng(seed)
        keys = rng.random((draws, total))
        picks = np.argsort(keys, axis=1)[:, :n2]
        cand_sum = values[picks].sum(axis=1)
        stats = cand_sum / n2 - (values.sum() - cand_sum) / n1
        tol = _TIE_TOL * max(1.0, float(np.abs(values).max()))
        upper = (1 + np.count_nonzero(stats >= observed - tol)) / (1 + draws)
        lower = (1 + np.count_nonzero(stats <= observed + tol)) / (1 + draws)
        exact, evaluated = False, draws
    p = min(1.0, 2.0 * min(upper, lower))
    return PermutationTest(
        statistic=float(observed), p_value=float(p), exact=exact, splits=evaluated, min_p_value=minimum_p_value(n1, n2)
    )


def _arm_log_stat_draws(
    arm: Sequence[np.ndarray], resamples: int, rng: np.random.Generator, max_cells: int = 4_000_000
) -> np.ndarray:
    """Hierarchical bootstrap of one arm's mean log median: (resamples,) draws."""
    n = len(arm)
    picks = rng.integers(0, n, size=(resamples, n))
    out = np.empty((resamples, n))
    flat = out.reshape(-1)  # a view: writing it fills ``out``
    for r, values in enumerate(arm):
        slots = np.flatnonzero(picks.reshape(-1) == r)
        m = values.size
        step = max(1, max_cells // max(m, 1))
        for start in range(0, slots.size, step):
            chunk = slots[start : start + step]
            idx = rng.integers(0, m, size=(chunk.size, m))
            flat[chunk] = np.log(np.maximum(np.median(values[idx], axis=1), np.finfo(float).tiny))
    return out.mean(axis=1)


def bootstrap_ratio_interval(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of candidate/baseline (geometric means of run medians) from a hierarchical
    bootstrap: runs resampled within each arm, then requests within each drawn run. Seeded."""
    arms = [[np.asarray(v, dtype=float) for v in arm] for arm in (base, cand)]
    for label, arm in zip(("baseline", "candidate"), arms):
        if not arm or any(v.size == 0 for v in arm):
            raise StudyError(f"bootstrap: every {label} run needs at least one per-request TPOT")
    rng = np.random.default_rng(seed)
    diff = _arm_log_stat_draws(arms[1], resamples, rng) - _arm_log_stat_draws(arms[0], resamples, rng)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(diff, [tail, 1.0 - tail])
    return float(math.exp(low)), float(math.exp(high))


# --------------------------------------------------------------------------- inputs


def summarise_run(run: RunRequests, measurability: Measurability | None = None) -> RunSummary:
    """A :class:`RunSummary` from a run's per-request timings (assessed here unless given)."""
    m = measurability if measurability is not None else assess_run(run)
    return RunSummary(
        name=run.name,
        tpots_s=tuple(float(x) for x in per_request_tpot_s(run)),
        measurable=m.measurable,
        unmeasurable_reasons=tuple(m.reasons),
        start_time_s=run.start_time_s,
        median_clock_mhz=run.median_clock_mhz,
        e2e_per_token_s=tuple(float(x) for x in per_request_e2e_per_token_s(run)),
    )


def _geomean(values: Sequence[float]) -> float:
    return float(math.exp(np.mean(np.log(values))))


def arms_interleaved(base_starts: Sequence[float], cand_starts: Sequence[float]) -> bool:
    """False when every run of one arm started before every run of the other."""
    return not (max(base_starts) < min(cand_starts) or max(cand_starts) < min(base_starts))


# --------------------------------------------------------------------------- the verdict


def statistical_claim(p_value: float, interval: tuple[float, float] | None, ratio: float, alpha: float = ALPHA) -> str:
    """The test's part of the rule alone: a direction when p < alpha and the interval excludes 1."""
    if interval is None or not p_value < alpha or interval[0] <= 1.0 <= interval[1]:
        return "no claim"
    return "faster" if ratio < 1.0 else "slower"


def _clock_part(
    base: Sequence[RunSummary], cand: Sequence[RunSummary], ratio: float | None, tolerance: float, reasons: list[str]
) -> tuple[bool, float | None, dict[str, float] | None, float | None]:
    """(clocks allow a claim, clock ratio, cycles per token per arm, clock-adjusted ratio)."""
    clocks = [r.median_clock_mhz for r in (*base, *cand)]
    if all(c is None for c in clocks):
        reasons.append("clocks were not recorded: the comparison assumes both arms ran at the same clock")
        return True, None, None, None
    missing = [r.name for r in (*base, *cand) if r.median_clock_mhz is None or not r.median_clock_mhz > 0]
    if missing:
        reasons.append(f"no median clock for run(s) {', '.join(missing)}: clocks cannot be compared")
        return False, None, None, None
    cb = _geomean([r.median_clock_mhz for r in base])  # type: ignore[misc]
    cc = _geomean([r.median_clock_mhz for r in cand])  # type: ignore[misc]
    clock_ratio = cc / cb
    ok = abs(clock_ratio - 1.0) <= tolerance
    if not ok:
        reasons.append(
            f"clocks differ by {clock_ratio - 1.0:+.1%} (baseline {cb:.0f} MHz, candidate {cc:.0f} MHz), "
            f"more than the {tolerance:.0%} tolerance"
        )
    cycles = None
    adjusted = None
    if ratio is not None and all(r.tpots_s for r in (*base, *cand)):
        cycles = {
            label: _geomean([r.median_tpot_s * r.median_clock_mhz * 1e6 for r in arm])  # type: ignore[operator]
            for label, arm in (("baseline", base), ("candidate", cand))
        }
        adjusted = cycles["candidate"] / cycles["baseline"]
        reasons.append(
            f"cycles per token (TPOT x median clock): baseline {cycles['baseline'] / 1e6:.3g} M, "
            f"candidate {cycles['candidate'] / 1e6:.3g} M; had the clocks been equal, the TPOT ratio "
            f"would have been about {adjusted:.3f} (an estimate of what the clock difference explains, "
            "not the effect of the candidate's setting: that setting may itself change the clock)"
        )
    return ok, clock_ratio, cycles, adjusted


def compare_runs(
    base: Sequence[RunSummary],
    cand: Sequence[RunSummary],
    *,
    alpha: float = ALPHA,
    clock_tolerance: float = CLOCK_TOLERANCE,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    check_interleaving: bool = True,
    check_measurable: bool = True,
) -> Verdict:
    """The verdict on candidate vs baseline TPOT from per-run summaries (see the module text).

    ``check_interleaving=False`` and ``check_measurable=False`` leave those guards out (calibration
    measures the test alone; the guards only ever turn a claim into "no claim").
    """
    if not base or not cand:
        raise StudyError(f"verdict: {len(base)} baseline and {len(cand)} candidate runs, expected at least 1 each")
    reasons: list[str] = []
    runs = {"baseline": len(base), "candidate": len(cand)}
    min_p = minimum_p_value(len(base), len(cand))
    measurable = all(r.measurable for r in (*base, *cand))
    allowed = True
    for r in (*base, *cand):
        if not r.measurable:
            reasons.append(f"run {r.name}: per-token latency not measured ({'; '.join(r.unmeasurable_reasons)})")
    if not measurable and check_measurable:
        allowed = False

    e2e_ratio = None
    if all(r.e2e_per_token_s for r in (*base, *cand)):
        e2e = [[float(np.median(r.e2e_per_token_s)) for r in arm] for arm in (base, cand)]
        if all(v > 0 for arm in e2e for v in arm):
            e2e_ratio = _geomean(e2e[1]) / _geomean(e2e[0])

    medians_ok = all(r.tpots_s and r.median_tpot_s > 0 for r in (*base, *cand))
    ratio = ci = p = None
    test: PermutationTest | None = None
    base_ms = cand_ms = None
    if medians_ok:
        lb = [math.log(r.median_tpot_s) for r in base]
        lc = [math.log(r.median_tpot_s) for r in cand]
        test = permutation_test(lb, lc, seed=seed)
        ratio, p = math.exp(test.statistic), test.p_value
        base_ms, cand_ms = math.exp(np.mean(lb)) * 1e3, math.exp(np.mean(lc)) * 1e3
        ci = bootstrap_ratio_interval(
            [r.tpots_s for r in base], [r.tpots_s for r in cand], confidence=confidence, resamples=resamples, seed=seed
        )
        kind = f"exact over all {test.splits} splits" if test.exact else f"Monte-Carlo, {test.splits} random splits"
        reasons.append(
            f"TPOT ratio {ratio:.3f} (candidate {cand_ms:.3g} ms / baseline {base_ms:.3g} ms), "
            f"{confidence:.0%} interval [{ci[0]:.3f}, {ci[1]:.3f}], p = {p:.3g} "
            f"(permutation test, {kind})"
        )
        if not p < alpha:
            reasons.append(f"p = {p:.3g} is not below alpha = {alpha:g}")
        if ci[0] <= 1.0 <= ci[1]:
            reasons.append(f"the {confidence:.0%} interval includes 1 (no change)")
    else:
        allowed = False
        reasons.append("a run has no positive median TPOT: no TPOT ratio can be computed")
        if e2e_ratio is not None:
            reasons.append(
                f"end-to-end latency per output token (first token included, not a TPOT), "
                f"candidate / baseline: {e2e_ratio:.3f}"
            )
    if min_p >= alpha:
        allowed = False
        reasons.append(
            f"the design cannot reach significance: with {len(base)} vs {len(cand)} runs the smallest "
            f"possible two-sided p is {min_p:.3g}, not below alpha = {alpha:g}; an exact test needs at "
            f"least {runs_needed(alpha)} runs per arm"
        )

    interleaved: bool | None = None
    starts_b = [r.start_time_s for r in base if r.start_time_s is not None]
    starts_c = [r.start_time_s for r in cand if r.start_time_s is not None]
    if len(starts_b) < len(base) or len(starts_c) < len(cand):
        if check_interleaving:
            allowed = False
            reasons.append("run start times not known: whether the arms were interleaved in time cannot be checked")
    else:
        interleaved = arms_interleaved(starts_b, starts_c)
        if not interleaved and check_interleaving:
            allowed = False
            first = "baseline" if max(starts_b) < min(starts_c) else "candidate"
            reasons.append(
                f"every {first} run started before every other run: the arms were not interleaved in "
                "time, so drift cannot be told from the effect"
            )

    clocks_ok, clock_ratio, cycles, adjusted = _clock_part(base, cand, ratio, clock_tolerance, reasons)
    allowed = allowed and clocks_ok

    claim = statistical_claim(p, ci, ratio, alpha) if (ratio is not None and p is not None) else "no claim"
    verdict = claim if allowed else "no claim"
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
        alpha=alpha,
        runs=runs,
        reasons=reasons,
        exact=test.exact if test else True,
        splits=test.splits if test else 0,
        baseline_tpot_ms=base_ms,
        candidate_tpot_ms=cand_ms,
        interleaved=interleaved,
        clock_ratio=clock_ratio,
        cycles_per_token=cycles,
        clock_adjusted_ratio=adjusted,
        e2e_per_token_ratio=e2e_ratio,
    )
