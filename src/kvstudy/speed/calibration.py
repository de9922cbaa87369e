"""How often the speed verdict claims a difference that does not exist, and what it can detect.

From A/A data (runs of one configuration; the noise of the machine and the method, no effect):

* :func:`false_claim_rate` splits the A/A runs into two pseudo-arms many times (seeded) and counts
  how often the verdict's test claims "faster" or "slower";
* :func:`simulated_false_claim_rate` draws designs of ``n`` runs per arm with replacement from the
  A/A runs (a design larger than the capture) and counts claims;
* :func:`power` does the same with one arm's TPOTs multiplied by ``1 + change`` and counts claims
  in the right direction;
* :func:`minimum_detectable_change` searches the smallest change detected with 80 % power.

The rule counted is the test's part of :func:`kvstudy.speed.verdict.compare_runs` (p < alpha and
the interval excluding 1): the other conditions (every run measurable, clocks comparable, arms
interleaved) can only turn a claim into "no claim", so the rates here are upper bounds for the full
verdict's false claims, and its power when those conditions hold. All functions are pure and
seeded: the same input and seed give the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from kvstudy.errors import StudyError
from kvstudy.speed.verdict import (
    ALPHA,
    RunSummary,
    bootstrap_ratio_interval,
    minimum_p_value,
    permutation_test,
    statistical_claim,
)

SPLITS = 1_000  # pseudo-arm splits / simulated designs (>= 1,000: the rate's own SE <= 0.7 points at 5 %)
CALIBRATION_RESAMPLES = 400  # bootstrap draws per simulated verdict (the interval only matters once p < alpha)
TARGET_POWER = 0.8


@dataclass(frozen=True)
class ClaimRate:
    """How many of ``trials`` simulated comparisons made a claim, with a one-sided 95 % upper bound."""

    what: str
    claims: int
    trials: int
    rate: float
    upper_95: float  # Clopper-Pearson one-sided 95 % upper bound of the rate
    n_base: int
    n_cand: int
    change: float | None = None  # true candidate/baseline TPOT ratio minus 1 (power only)


def _upper_bound(claims: int, trials: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial rate."""
    if claims >= trials:
        return 1.0
    return float(stats.beta.ppf(level, claims + 1, trials - claims))


def _rate(what: str, claims: int, trials: int, n_base: int, n_cand: int, change: float | None = None) -> ClaimRate:
    return ClaimRate(
        what=what,
        claims=claims,
        trials=trials,
        rate=claims / trials,
        upper_95=_upper_bound(claims, trials),
        n_base=n_base,
        n_cand=n_cand,
        change=change,
    )


def _usable(runs: Sequence[RunSummary]) -> list[RunSummary]:
    bad = [r.name for r in runs if not r.tpots_s or not r.median_tpot_s > 0]
    if bad:
        raise StudyError(f"calibration: run(s) {', '.join(bad)} have no positive per-request TPOT")
    return list(runs)


def claim_by_test(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    *,
    alpha: float = ALPHA,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
    use_interval: bool = True,
) -> str:
    """The verdict test on per-request TPOTs of each run: "faster", "slower" or "no claim".

    ``use_interval=False`` counts p < alpha alone (faster; the interval rarely decides once p < alpha)."""
    lb = [math.log(float(np.median(v))) for v in base]
    lc = [math.log(float(np.median(v))) for v in cand]
    test = permutation_test(lb, lc, seed=seed)
    if not test.p_value < alpha:
        return "no claim"
    if not use_interval:
        return "faster" if test.statistic < 0 else "slower"
    ci = bootstrap_ratio_interval(base, cand, resamples=resamples, seed=seed)
    return statistical_claim(test.p_value, ci, math.exp(test.statistic), alpha)


def false_claim_rate(
    runs: Sequence[RunSummary],
    *,
    n_base: int | None = None,
    n_cand: int | None = None,
    splits: int = SPLITS,
    alpha: float = ALPHA,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
) -> ClaimRate:
    """Split the A/A ``runs`` at random (without replacement) into pseudo-arms of ``n_base`` and
    ``n_cand`` runs (default: half each) ``splits`` times; the share of splits with a claim."""
    pool = _usable(runs)
    n1 = n_base if n_base is not None else len(pool) // 2
    n2 = n_cand if n_cand is not None else len(pool) - n1
    if n1 < 1 or n2 < 1 or n1 + n2 > len(pool):
        raise StudyError(f"calibration: cannot split {len(pool)} A/A runs into {n1} + {n2}")
    rng = np.random.default_rng(seed)
    tpots = [np.asarray(r.tpots_s, dtype=float) for r in pool]
    claims = 0
    for i in range(splits):
        order = rng.permutation(len(pool))
        base = [tpots[j] for j in order[:n1]]
        cand = [tpots[j] for j in order[n1 : n1 + n2]]
        claims += claim_by_test(base, cand, alpha=alpha, resamples=resamples, seed=seed + i) != "no claim"
    return _rate("A/A runs split into pseudo-arms", claims, splits, n1, n2)


def _simulate(
    pool: Sequence[np.ndarray],
    n_base: int,
    n_cand: int,
    ratio: float,
    simulations: int,
    alpha: float,
    resamples: int,
    seed: int,
    use_interval: bool = True,
) -> tuple[int, int]:
    """(claims in any direction, claims in the direction of ``ratio``) over simulated designs."""
    if n_base < 1 or n_cand < 1:
        raise StudyError(f"calibration: {n_base} vs {n_cand} runs per arm, expected at least 1 each")
    rng = np.random.default_rng(seed)
    want = "slower" if ratio > 1.0 else "faster"
    any_claims = right = 0
    for i in range(simulations):
        picks = rng.integers(0, len(pool), size=n_base + n_cand)
        base = [pool[j] for j in picks[:n_base]]
        cand = [pool[j] * ratio for j in picks[n_base:]]
        claim = claim_by_test(base, cand, alpha=alpha, resamples=resamples, seed=seed + i, use_interval=use_interval)
        any_claims += claim != "no claim"
        right += claim == want
    return any_claims, right


def simulated_false_claim_rate(
    runs: Sequence[RunSummary],
    *,
    n_per_arm: int = 5,
    simulations: int = SPLITS,
    alpha: float = ALPHA,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
) -> ClaimRate:
    """Designs of ``n_per_arm`` runs per arm drawn with replacement from the A/A ``runs`` (no effect
    added); the share with a claim."""
    pool = [np.asarray(r.tpots_s, dtype=float) for r in _usable(runs)]
    claims, _ = _simulate(pool, n_per_arm, n_per_arm, 1.0, simulations, alpha, resamples, seed)
    return _rate("designs resampled from A/A runs, no change", claims, simulations, n_per_arm, n_per_arm)


def power(
    runs: Sequence[RunSummary],
    *,
    change: float = 0.2,
    n_per_arm: int = 5,
    simulations: int = SPLITS,
    alpha: float = ALPHA,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
) -> ClaimRate:
    """Share of designs (``n_per_arm`` runs per arm, drawn with replacement from the A/A ``runs``,
    candidate TPOTs multiplied by ``1 + change``) in which the verdict claims the true direction."""
    if not change > -1.0 or change == 0.0:
        raise StudyError(f"power: change is {change!r}, expected a non-zero fraction above -1 (0.2 = 20 % slower)")
    pool = [np.asarray(r.tpots_s, dtype=float) for r in _usable(runs)]
    _, right = _simulate(pool, n_per_arm, n_per_arm, 1.0 + change, simulations, alpha, resamples, seed)
    return _rate(
        f"designs resampled from A/A runs, candidate TPOT x {1.0 + change:g}",
        right,
        simulations,
        n_per_arm,
        n_per_arm,
        change=change,
    )


def minimum_detectable_change(
    runs: Sequence[RunSummary],
    *,
    n_per_arm: int = 5,
    n_cand: int | None = None,
    target_power: float = TARGET_POWER,
    alpha: float = ALPHA,
    simulations: int = 400,
    resamples: int = 200,
    seed: int = 0,
    max_change: float = 3.0,
    precision: float = 0.005,
    use_interval: bool = True,
) -> float | None:
    """Smallest TPOT increase (fraction: 0.2 = candidate 20 % slower) that a design of ``n_per_arm``
    baseline and ``n_cand`` (default the same) candidate runs detects with ``target_power``, by
    bisection with common random numbers; None when no change up to ``max_change`` is (the design
    cannot reach p < alpha, or the noise is too large). ``use_interval=False``: p < alpha alone."""
    n2 = n_cand if n_cand is not None else n_per_arm
    if minimum_p_value(n_per_arm, n2) >= alpha:
        return None
    pool = [np.asarray(r.tpots_s, dtype=float) for r in _usable(runs)]

    def detected(change: float) -> bool:
        _, right = _simulate(pool, n_per_arm, n2, 1.0 + change, simulations, alpha, resamples, seed, use_interval)
        return right / simulations >= target_power

    if not detected(max_change):
        return None
    low, high = 0.0, max_change
    while high - low > precision:
        mid = (low + high) / 2.0
        if detected(mid):
            high = mid
        else:
            low = mid
    return high


def centred(arms: Sequence[Sequence[RunSummary]]) -> list[RunSummary]:
    """The runs of several arms pooled as noise: each arm's TPOTs divided by the geometric mean of its
    run medians (its effect removed), for power and detectable change when no A/A runs exist."""
    pooled: list[RunSummary] = []
    for arm in arms:
        usable = _usable(arm)
        scale = math.exp(float(np.mean([math.log(r.median_tpot_s) for r in usable])))
        pooled.extend(replace(r, tpots_s=tuple(t / scale for t in r.tpots_s)) for r in usable)
    return pooled
