"""Bootstrap intervals: a hierarchical bootstrap of a ratio of run medians, and of a line's slope.

Both resample at two levels (runs within an arm, then requests within each drawn run), because
requests of one run share its state and are not independent replicates; the interval is the
percentile interval of the replicates. scipy's ``bootstrap`` resamples one level only, so these
are written here. With few runs the run level has few distinct draws and the interval is if
anything too narrow about between-run noise; a permutation p is the guard on false claims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from kvstudy.errors import StudyError

CONFIDENCE = 0.95  # level of the reported interval
BOOTSTRAP_RESAMPLES = 2_000  # hierarchical bootstrap draws for the interval

Floats = npt.NDArray[np.float64]


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
