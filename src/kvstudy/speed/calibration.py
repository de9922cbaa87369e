"""How often the speed verdict claims a difference that does not exist, and what it can detect.

From A/A runs (one configuration: the noise, no effect): the false-claim rate over real splits
into pseudo-arms and over designs resampled from the seed blocks, the power for a given change with
its Clopper-Pearson interval, its range over the noise estimate's own 95 % interval, and the
smallest change detected with 80 % power. A design that cannot reach p < alpha is reported as such
(``ClaimRate.trials`` 0), since "0 false claims" would say nothing.

The rule counted is the test's part of :func:`kvstudy.speed.verdict.compare_runs`: its other
conditions only turn claims into "no claim", so the rates are upper bounds. Pure and seeded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from kvstudy.errors import StudyError
from kvstudy.speed.verdict import ALPHA, RunSummary, statistical_claim
from kvstudy.stats.binary import TARGET_POWER, clopper_pearson
from kvstudy.stats.binary_power import smallest_passing
from kvstudy.stats.permutation import (
    blocked_min_p,
    bootstrap_ratio_interval,
    minimum_p_value,
    permutation_test,
    sign_flip_power,
)

SPLITS = 1_000  # pseudo-arm splits / simulated designs (>= 1,000: the rate's own SE <= 0.7 points at 5 %)
CALIBRATION_RESAMPLES = 400  # bootstrap draws per simulated verdict (the interval only matters once p < alpha)

Blocks = list[list[np.ndarray]]  # per seed, the per-request TPOTs of its runs


@dataclass(frozen=True)
class ClaimRate:
    """How many of ``trials`` simulated comparisons made a claim; no trials: the design cannot reach p < alpha."""

    claims: int
    trials: int
    n_base: int
    n_cand: int
    min_p: float  # smallest two-sided p the design can reach
    blocked: bool  # seed blocks (one run per arm each) rather than free splits

    @property
    def rate(self) -> float:
        return self.claims / self.trials if self.trials else math.nan

    @property
    def ci_95(self) -> tuple[float, float]:
        """Two-sided Clopper-Pearson 95 % interval of the rate."""
        return clopper_pearson(self.claims, self.trials) if self.trials else (math.nan, math.nan)

    @property
    def text(self) -> str:
        """The rate with its interval, or why there is none."""
        if not self.trials:
            return (
                f"calibration not possible with this design: {self.n_base} vs {self.n_cand}"
                f"{' seed blocks' if self.blocked else ' runs'}, smallest reachable p {self.min_p:.3g}"
            )
        return (
            f"{self.claims} of {self.trials} ({self.rate:.1%}, 95 % interval {self.ci_95[0]:.1%} to "
            f"{self.ci_95[1]:.1%})"
        )


def _noise(runs: Sequence[RunSummary]) -> tuple[list[np.ndarray], Blocks | None]:
    """The runs' per-request TPOTs (each run must have a positive median) and their seed blocks."""
    bad = [r.name for r in runs if not r.tpots_s or not r.median_tpot_s > 0]
    if bad:
        raise StudyError(f"calibration: run(s) {', '.join(bad)} have no positive per-request TPOT")
    return [np.asarray(r.tpots_s, dtype=float) for r in runs], seed_blocks(runs)


def seed_blocks(runs: Sequence[RunSummary]) -> Blocks | None:
    """The runs' per-request TPOTs grouped by seed (blocks of at least 2 runs); None when a run names
    no seed or no seed has two runs."""
    if not runs or any(r.block is None for r in runs):
        return None
    groups: dict[int, list[np.ndarray]] = {}
    for r in runs:
        groups.setdefault(int(r.block), []).append(np.asarray(r.tpots_s, dtype=float))  # type: ignore[arg-type]
    return [g for g in groups.values() if len(g) >= 2] or None


def claim_by_test(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    *,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
    use_interval: bool = True,
    blocked: bool = False,
) -> str:
    """The verdict test on per-request TPOTs of each run: "faster", "slower" or "no claim".

    ``blocked``: run i of each arm forms block i (labels permuted within blocks).
    ``use_interval=False`` counts p < alpha alone (the interval rarely decides once p < alpha)."""
    lb = [math.log(np.median(v)) for v in base]
    lc = [math.log(np.median(v)) for v in cand]
    blocks = list(range(len(lb))) if blocked else None
    test = permutation_test(lb, lc, base_blocks=blocks, cand_blocks=blocks, seed=seed)
    if not test.p_value < ALPHA:
        return "no claim"
    if not use_interval:
        return "faster" if test.statistic < 0 else "slower"
    ci = bootstrap_ratio_interval(base, cand, resamples=resamples, seed=seed)
    return statistical_claim(test.p_value, ci, math.exp(test.statistic))


def _rate(
    pool: Sequence[np.ndarray],
    blocks: Blocks | None,
    n_base: int,
    n_cand: int,
    change: float,
    trials: int,
    resamples: int,
    seed: int,
    *,
    resample: bool = True,
    use_interval: bool = True,
) -> ClaimRate:
    """Claims over ``trials`` designs, candidate TPOTs times ``1 + change``: in its direction, or (no
    change) in any. With ``blocks``, each of ``n_base`` seed blocks (drawn with replacement when
    ``resample``, else every block once) gives one of its runs to each arm at random; otherwise runs
    are drawn with replacement (``resample``) or split at random."""
    blocked = blocks is not None
    min_p = blocked_min_p([(1, 1)] * n_base) if blocked else minimum_p_value(n_base, n_cand)
    if min_p >= ALPHA:
        return ClaimRate(0, 0, n_base, n_cand, min_p, blocked)
    rng = np.random.default_rng(seed)
    want = "slower" if change > 0 else "faster"
    hits = 0
    for i in range(trials):
        if blocks is not None:
            chosen = rng.integers(0, len(blocks), size=n_base) if resample else range(n_base)
            pairs = [[blocks[k][j] for j in rng.choice(len(blocks[k]), size=2, replace=False)] for k in chosen]
            base, cand = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            picks = rng.integers(0, len(pool), size=n_base + n_cand) if resample else rng.permutation(len(pool))
            base, cand = [pool[j] for j in picks[:n_base]], [pool[j] for j in picks[n_base:]]
        cand = [c * (1.0 + change) for c in cand]
        claim = claim_by_test(
            base, cand, resamples=resamples, seed=seed + i, use_interval=use_interval, blocked=blocked
        )
        hits += claim == want if change else claim != "no claim"
    return ClaimRate(hits, trials, n_base, n_cand, min_p, blocked)


def false_claim_rate(
    runs: Sequence[RunSummary], *, splits: int = SPLITS, resamples: int = CALIBRATION_RESAMPLES, seed: int = 0
) -> ClaimRate:
    """Split the A/A ``runs`` at random into pseudo-arms ``splits`` times; the share of splits with
    a claim: with seeds known each seed block's runs go one to each pseudo-arm (the blocked design
    the verdict tests), otherwise half the runs to each. A design that cannot reach p < alpha counts nothing."""
    pool, blocks = _noise(runs)
    n1 = len(blocks) if blocks else len(pool) // 2
    n2 = n1 if blocks else len(pool) - n1
    if n1 < 1:
        raise StudyError(f"calibration: cannot split {len(pool)} A/A runs into {n1} + {n2}")
    return _rate(pool, blocks, n1, n2, 0.0, splits, resamples, seed, resample=False)


def power(
    runs: Sequence[RunSummary],
    *,
    change: float = 0.2,
    n_per_arm: int = 6,
    simulations: int = SPLITS,
    resamples: int = CALIBRATION_RESAMPLES,
    seed: int = 0,
) -> ClaimRate:
    """Designs of ``n_per_arm`` seed blocks (runs per arm) resampled from the A/A runs, candidate TPOTs
    times ``1 + change``: the share claiming its direction; with ``change`` 0, the share with any
    claim (the false-claim rate)."""
    if not change > -1.0:
        raise StudyError(f"power: change is {change!r}, expected a fraction above -1 (0.2 = 20 % slower)")
    return _rate(*_noise(runs), n_per_arm, n_per_arm, change, simulations, resamples, seed)


@dataclass(frozen=True)
class NoiseSensitivity:
    """Power under a normal model of the per-seed log differences, at the noise estimate and at both
    ends of its 95 % interval (chi-square with ``df`` degrees of freedom)."""

    sigma: float  # SD of one seed's log(candidate / baseline) difference with no change
    sigma_low: float
    sigma_high: float
    df: int
    power: float  # at sigma
    power_low_noise: float  # at sigma_low (the optimistic end)
    power_high_noise: float  # at sigma_high

    @property
    def text(self) -> str:
        return (
            f"{self.power:.0%} at the estimated noise (SD {self.sigma:.3f} of a per-seed log difference, "
            f"{self.df} df); {self.power_high_noise:.0%} to {self.power_low_noise:.0%} across that "
            f"noise's 95 % interval (SD {self.sigma_low:.3f} to {self.sigma_high:.3f})"
        )


def noise_sd(runs: Sequence[RunSummary]) -> tuple[float, int] | None:
    """The A/A noise: SD of one seed's log(candidate / baseline) median-TPOT difference when nothing
    changed, with its degrees of freedom; without seed blocks sqrt(2) x the runs' log-median SD.
    None when the runs cannot estimate it."""
    pool, blocks = _noise(runs)
    if blocks is not None:
        d = [math.log(np.median(b[1])) - math.log(np.median(b[0])) for b in blocks]
        df, var = len(d), float(np.mean(np.square(d)))  # the mean difference is 0 under A/A
    else:
        df = len(pool) - 1
        var = 2.0 * float(np.var([math.log(r.median_tpot_s) for r in runs], ddof=1)) if df >= 1 else math.nan
    return (math.sqrt(var), df) if df >= 1 and var > 0 else None


def noise_sensitivity(
    runs: Sequence[RunSummary], *, change: float = 0.2, n_per_arm: int = 6, simulations: int = 4_000, seed: int = 0
) -> NoiseSensitivity | None:
    """The :class:`NoiseSensitivity` of ``n_per_arm`` seed blocks for ``change``; None when not estimable."""
    noise = noise_sd(runs)
    if noise is None or blocked_min_p([(1, 1)] * n_per_arm) >= ALPHA or n_per_arm > 16:
        return None
    sigma, df = noise
    low, high = (math.sqrt(df * sigma**2 / float(stats.chi2.ppf(q, df))) for q in (0.975, 0.025))
    at = [sign_flip_power(s, change, n_per_arm, ALPHA, simulations, seed) for s in (sigma, low, high)]
    return NoiseSensitivity(sigma, low, high, df, *at)


def minimum_detectable_change(
    runs: Sequence[RunSummary],
    *,
    n_per_arm: int = 6,
    n_cand: int | None = None,
    simulations: int = 400,
    resamples: int = 200,
    seed: int = 0,
    max_change: float = 3.0,
    precision: float = 0.005,
    use_interval: bool = True,
) -> float | None:
    """Smallest TPOT increase (0.2: 20 % slower) a design of ``n_per_arm`` vs ``n_cand`` runs detects
    with :data:`TARGET_POWER`, by bisection with common random numbers; None when none up to ``max_change`` is
    (a design that cannot reach p < alpha detects none)."""
    n2 = n_cand if n_cand is not None else n_per_arm
    pool, blocks = _noise(runs)
    blocks = blocks if n2 == n_per_arm else None

    def detected(change: float) -> bool:
        rate = _rate(pool, blocks, n_per_arm, n2, change, simulations, resamples, seed, use_interval=use_interval)
        return rate.rate >= TARGET_POWER

    return smallest_passing(detected, max_change, precision)


def centred(arms: Sequence[Sequence[RunSummary]]) -> list[RunSummary]:
    """The runs of several arms pooled as noise: each arm's TPOTs divided by the geometric mean of its
    run medians (its effect removed), for power and detectable change when no A/A runs exist."""
    pooled: list[RunSummary] = []
    for arm in arms:
        _noise(arm)
        scale = math.exp(np.mean([math.log(r.median_tpot_s) for r in arm]))
        pooled.extend(replace(r, tpots_s=tuple(t / scale for t in r.tpots_s)) for r in arm)
    return pooled
