"""Exact permutation tests on per-run values, within blocks or free, and what a design can reach.

scipy's ``permutation_test`` has no blocked (stratified) form and does not enumerate the products
of block splits exactly, so :func:`permutation_test` is written here: exact up to
:data:`MAX_EXACT_SPLITS` splits, seeded Monte Carlo beyond. No library computes the power of an
exact sign-flip test either (:func:`sign_flip_power`, simulated; :func:`runs_needed`).

A linear drift over the run order (:func:`drift_check`), estimated from the runs themselves, and
whether an arm difference clears it: what an alternating (A B A B ...) design needs before it may
claim, since its candidate always runs later than its baseline. Ordinary least squares with numpy
and a t test from scipy; the bound on what the drift can add is the study's own.

Bootstrap intervals (a ratio of run medians, :func:`bootstrap_ratio_interval`; a line's slope,
:func:`bootstrap_line`) resample at two levels (runs within an arm, then requests within each drawn
run), because requests of one run share its state and are not independent replicates; the interval
is the percentile interval of the replicates. scipy's ``bootstrap`` resamples one level only, so
these are written here. With few runs the run level has few distinct draws and the interval is if
anything too narrow about between-run noise; a permutation p is the guard on false claims.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from kvstudy.errors import StudyError
from kvstudy.stats.binary import ALPHA, TARGET_POWER

MAX_EXACT_SPLITS = 20_000  # enumerate all splits up to this many (C(16, 8) = 12,870)
MONTE_CARLO_DRAWS = 20_000  # random splits otherwise (>= 10,000 keeps the p-value's own error < 0.005)
CONFIDENCE = 0.95  # level of the reported bootstrap interval
BOOTSTRAP_RESAMPLES = 2_000  # hierarchical bootstrap draws for the interval
_TIE_TOL = 1e-12  # statistics this close to the observed one count as ties (float sums)

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PermutationTest:
    """Result of the permutation test on per-run values (candidate minus baseline means)."""

    statistic: float
    p_value: float
    exact: bool
    splits: int  # splits evaluated (all of them when exact)
    min_p_value: float  # smallest two-sided p the design can reach
    blocks: int = 0  # seed blocks permuted within (0: unblocked)


def minimum_p_value(n_base: int, n_cand: int) -> float:
    """Smallest two-sided p the exact permutation test can give with these arm sizes: 2 / C(n1+n2, n1)."""
    return blocked_min_p([(n_base, n_cand)])


def runs_per_arm_needed(alpha: float = ALPHA) -> int:
    """Fewest runs per arm (equal arms) with which an exact test can reach p < ``alpha``."""
    n = 1
    while minimum_p_value(n, n) >= alpha:
        n += 1
    return n


@functools.lru_cache(maxsize=32)
def _split_matrix(total: int, n_cand: int) -> Floats:
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
    base_blocks: Sequence[int] | None = None,
    cand_blocks: Sequence[int] | None = None,
    seed: int = 0,
) -> PermutationTest:
    """Permutation test of mean(cand) - mean(base) on per-run values (e.g. log median TPOT), within
    blocks when ``base_blocks``/``cand_blocks`` are given (blocks lacking an arm left out); exact up
    to ``MAX_EXACT_SPLITS`` splits, else ``MONTE_CARLO_DRAWS`` seeded random splits.
    """
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    if b.size < 1 or c.size < 1:
        raise StudyError(f"permutation test: {b.size} baseline and {c.size} candidate runs, expected at least 1 each")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        raise StudyError("permutation test: per-run values must be finite (a run with zero TPOT?)")
    if base_blocks is not None and cand_blocks is not None:
        return _blocked_test(b, c, list(base_blocks), list(cand_blocks), seed)
    values = np.concatenate([b, c])
    n1, n2, total = b.size, c.size, b.size + c.size
    observed = c.mean() - b.mean()
    tol = _TIE_TOL * max(1.0, float(np.abs(values).max()))
    exact = math.comb(total, n2) <= MAX_EXACT_SPLITS
    if exact:
        stats = _block_stats(values, n2)
    else:
        keys = np.random.default_rng(seed).random((MONTE_CARLO_DRAWS, total))
        cand_sum = values[np.argsort(keys, axis=1)[:, :n2]].sum(axis=1)
        stats = cand_sum / n2 - (values.sum() - cand_sum) / n1
    return PermutationTest(
        float(observed), _two_sided(stats, observed, tol, exact), exact, stats.size, minimum_p_value(n1, n2)
    )


def _two_sided(stats: Floats, observed: float, tol: float, exact: bool) -> float:
    """min(1, 2 x the smaller one-sided p): the share of splits at least as far out on each side,
    or (1 + hits) / (1 + draws) for random splits."""
    hits = np.array([np.count_nonzero(stats >= observed - tol), np.count_nonzero(stats <= observed + tol)])
    sides = hits / stats.size if exact else (1 + hits) / (1 + stats.size)
    return float(min(1.0, 2.0 * sides.min()))


def _block_stats(values: Floats, n_cand: int) -> Floats:
    """Every within-block difference (mean of the chosen candidate runs minus the rest's mean)."""
    n = values.size
    cand_sum: Floats = _split_matrix(n, n_cand) @ values
    diffs: Floats = cand_sum / n_cand - (values.sum() - cand_sum) / (n - n_cand)
    return diffs


def _blocked_test(b: Floats, c: Floats, bb: list[int], cb: list[int], seed: int) -> PermutationTest:
    blocks = [k for k in dict.fromkeys([*bb, *cb]) if k in bb and k in cb]
    options, observed_parts, sizes = [], [], []
    for k in blocks:
        vb = b[[i for i, x in enumerate(bb) if x == k]]
        vc = c[[i for i, x in enumerate(cb) if x == k]]
        options.append(_block_stats(np.concatenate([vb, vc]), vc.size))
        observed_parts.append(vc.mean() - vb.mean())
        sizes.append((vb.size, vc.size))
    observed = float(np.mean(observed_parts))
    splits = math.prod(o.size for o in options)
    scale = max(1.0, float(np.abs(np.concatenate([b, c])).max()))
    tol = _TIE_TOL * scale * len(blocks)
    exact = splits <= MAX_EXACT_SPLITS
    if exact:
        total = options[0]
        for o in options[1:]:
            total = (total[:, None] + o[None, :]).ravel()
        stats = total / len(blocks)
    else:
        rng = np.random.default_rng(seed)
        stats = np.sum([o[rng.integers(0, o.size, size=MONTE_CARLO_DRAWS)] for o in options], axis=0) / len(blocks)
    p = _two_sided(stats, observed, tol, exact)
    return PermutationTest(observed, p, exact, stats.size, blocked_min_p(sizes), len(blocks))


def blocked_min_p(block_sizes: Sequence[tuple[int, int]]) -> float:
    """Smallest two-sided p of an exact permutation test within blocks of (baseline, candidate) runs:
    2 / (product of C(n_b + n_c, n_c) over the blocks)."""
    splits = 1
    for nb, nc in block_sizes:
        if nb >= 1 and nc >= 1:
            splits *= math.comb(nb + nc, nc)
    return min(1.0, 2.0 / splits) if splits > 1 else 1.0


def blocks_needed(alpha: float) -> int:
    """Fewest seed blocks of one run per arm with which the blocked test can reach p < ``alpha``."""
    k = 1
    while 2.0 / 2**k >= alpha:
        k += 1
    return k


def sign_flip_power(sigma: float, change: float, n: int, alpha: float, simulations: int, seed: int) -> float:
    """Share of normal designs (n per-seed differences) whose exact sign-flip test claims the change."""
    rng = np.random.default_rng(seed)
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * n, indexing="ij")).reshape(n, -1)  # (n, 2^n)
    right = 0
    step = max(1, 400_000 // signs.shape[1])
    for start in range(0, simulations, step):
        size = min(step, simulations - start)
        d = rng.normal(math.log1p(change), sigma, size=(size, n))
        observed = d.mean(axis=1)
        flipped = d @ signs / n
        upper = (flipped >= observed[:, None] - 1e-12).mean(axis=1)
        lower = (flipped <= observed[:, None] + 1e-12).mean(axis=1)
        p = np.minimum(1.0, 2.0 * np.minimum(upper, lower))
        right += int(np.count_nonzero((p < alpha) & (np.sign(observed) == np.sign(change))))
    return right / simulations


@dataclass(frozen=True)
class RunsNeeded:
    """Seed blocks per arm (one run per arm each) a change needs at a power, under a noise."""

    change: float  # fraction: 0.1 = a 10 % change of TPOT
    sigma: float  # SD of a per-seed log difference
    runs_per_arm: int | None  # None: more than 10,000
    method: str  # "exact sign-flip test, simulated" or "normal approximation"
    power: float = TARGET_POWER


def runs_needed(
    sigma: float,
    change: float,
    *,
    power: float = TARGET_POWER,
    simulations: int = 1_000,
    max_exact: int = 14,
) -> RunsNeeded:
    """The fewest seed blocks per arm with which the blocked sign-flip test (the verdict's test)
    claims a TPOT change of ``change`` with ``power``, when a seed's log difference is normal with SD
    ``sigma`` (alpha ``ALPHA``): simulated up to ``max_exact`` blocks (never fewer than the design needs to reach
    p < alpha, :func:`blocks_needed`), beyond that the normal approximation
    ((z_(1-alpha/2) + z_power) x sigma / log(1 + change))^2."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise StudyError(f"noise SD: expected a positive number, got {sigma!r}")
    if not (0 < abs(change) < 10):
        raise StudyError(f"change: expected a fraction such as 0.1 (10 %), got {change!r}")
    n = blocks_needed(ALPHA)
    while n <= max_exact:
        if sign_flip_power(sigma, change, n, ALPHA, simulations, 0) >= power:
            return RunsNeeded(change, sigma, n, "exact sign-flip test, simulated", power)
        n += 1
    z = float(sps.norm.ppf(1 - ALPHA / 2) + sps.norm.ppf(power))
    approx = max(n, math.ceil((z * sigma / math.log1p(abs(change))) ** 2))
    return RunsNeeded(change, sigma, approx if approx <= 10_000 else None, "normal approximation", power)


# --------------------------------------------------------------------------- drift over the run order


@dataclass(frozen=True)
class DriftCheck:
    """A linear drift over the run order and whether the effect clears it: ``slope`` per run step,
    ``offset`` steps the candidate ran after the baseline, ``bound`` the most the drift adds to the
    effect, ``adjusted`` the effect with the drift removed, ``p_value`` its t test.
    """

    cleared: bool
    slope: float
    offset: float
    bound: float
    effect: float
    adjusted: float
    p_value: float
    reason: str


def drift_check(
    base_values: Sequence[float],
    cand_values: Sequence[float],
    base_starts: Sequence[float],
    cand_starts: Sequence[float],
    alpha: float = 0.05,
) -> DriftCheck:
    """Whether the arm difference (candidate mean minus baseline mean) clears a linear drift over the
    run order: ordinary least squares of the values on (1, arm, run position); claim only when the arm's
    coefficient has p < ``alpha`` and the observed difference, in the same direction, exceeds the bound
    on what the drift could have added to it."""
    runs = sorted([(float(t), 0, float(v)) for t, v in zip(base_starts, base_values)])
    runs = sorted(runs + [(float(t), 1, float(v)) for t, v in zip(cand_starts, cand_values)])
    y = np.array([v for _, _, v in runs])
    arm = np.array([a for _, a, _ in runs], dtype=float)
    pos = np.arange(len(runs), dtype=float)
    effect = float(y[arm == 1].mean() - y[arm == 0].mean())
    offset = float(pos[arm == 1].mean() - pos[arm == 0].mean())
    design = np.column_stack([np.ones_like(y), arm, pos])
    df = len(y) - 3
    if df < 1 or np.linalg.matrix_rank(design) < 3:
        return DriftCheck(False, math.nan, offset, math.inf, effect, math.nan, 1.0, "too few runs to estimate a drift")
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ beta
    cov = float(resid @ resid) / df * np.linalg.inv(design.T @ design)
    se_arm, se_slope = math.sqrt(max(cov[1, 1], 0.0)), math.sqrt(max(cov[2, 2], 0.0))
    adjusted, slope = float(beta[1]), float(beta[2])
    if se_arm > 0:
        p = float(2 * sps.t.sf(abs(adjusted) / se_arm, df))
    else:  # the runs lie exactly on a line: any arm difference is exact
        p = 0.0 if adjusted != 0 else 1.0
    bound = abs(offset) * (abs(slope) + float(sps.t.ppf(1 - alpha / 2, df)) * se_slope)
    cleared = p < alpha and abs(effect) > bound and adjusted * effect > 0
    reason = (
        f"run order: the candidate ran {offset:+.2g} run steps after the baseline on average; a linear drift "
        f"estimated from the runs ({slope:+.3g} log TPOT per run, SE {se_slope:.2g}) adds at most {bound:.3g} "
        f"to the log ratio {effect:+.3g}; with the drift removed it is {adjusted:+.3g} (p = {p:.3g}): "
        + ("the effect clears the drift" if cleared else "the effect does not clear the drift, no claim")
    )
    return DriftCheck(cleared, slope, offset, bound, effect, adjusted, p, reason)


# --------------------------------------------------------------------------- bootstraps


def _arm_log_stat_draws(
    arm: Sequence[Floats], resamples: int, rng: np.random.Generator, max_cells: int = 4_000_000
) -> Floats:
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
    means: Floats = out.mean(axis=1)
    return means


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


def ols(x: Floats, y: Floats) -> tuple[float, float]:
    """Intercept and slope of the least-squares line through (x, y)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise StudyError(f"fit: need at least two distinct lengths, got {sorted(set(x.tolist()))}")
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    return float(ym - slope * xm), slope


def percentile_interval(values: Floats) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap replicates."""
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_line(runs: Mapping[str, Mapping[int, Floats]], n_boot: int, seed: int = 0) -> tuple[Floats, Floats]:
    """(intercepts, slopes) of ``n_boot`` least-squares lines through per-(run, x) means, runs drawn
    with replacement, then each drawn run's values at each x; NaN where a draw covers one x only."""
    rng = np.random.default_rng(seed)
    names = list(runs)
    boot_a = np.empty(n_boot)
    boot_b = np.empty(n_boot)
    for i in range(n_boot):
        bx: list[float] = []
        by: list[float] = []
        for pick in rng.integers(0, len(names), len(names)):
            for x, values in runs[names[pick]].items():
                bx.append(x)
                by.append(float(rng.choice(values, values.size).mean()))
        try:
            boot_a[i], boot_b[i] = ols(np.asarray(bx), np.asarray(by))
        except StudyError:  # a draw of runs covering one x only
            boot_a[i], boot_b[i] = np.nan, np.nan
    return boot_a, boot_b
