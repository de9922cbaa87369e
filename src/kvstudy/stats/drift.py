"""A linear drift over the run order, estimated from the runs themselves, and whether an arm
difference clears it: what an alternating (A B A B ...) design needs before it may claim, since its
candidate always runs later than its baseline. Ordinary least squares with numpy and a t test from
scipy; the bound on what the drift can add is the study's own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


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
        p = float(2 * stats.t.sf(abs(adjusted) / se_arm, df))
    else:  # the runs lie exactly on a line: any arm difference is exact
        p = 0.0 if adjusted != 0 else 1.0
    bound = abs(offset) * (abs(slope) + float(stats.t.ppf(1 - alpha / 2, df)) * se_slope)
    cleared = p < alpha and abs(effect) > bound and adjusted * effect > 0
    reason = (
        f"run order: the candidate ran {offset:+.2g} run steps after the baseline on average; a linear drift "
        f"estimated from the runs ({slope:+.3g} log TPOT per run, SE {se_slope:.2g}) adds at most {bound:.3g} "
        f"to the log ratio {effect:+.3g}; with the drift removed it is {adjusted:+.3g} (p = {p:.3g}): "
        + ("the effect clears the drift" if cleared else "the effect does not clear the drift, no claim")
    )
    return DriftCheck(cleared, slope, offset, bound, effect, adjusted, p, reason)
