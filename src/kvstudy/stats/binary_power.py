"""What counts alone allow: exact power of the paired test, and bounds from published totals.

**Power**, exact (no library has it): the exact McNemar test conditions on the discordant count
``d ~ Binomial(N, psi)``; given ``d``, the baseline-only items are ``Binomial(d, (1 + delta/psi) / 2)``
for a loss ``delta``; summing the rejection region's probability over every ``d`` gives the power of
exactly the test the report runs (checked against a simulation of statsmodels' ``mcnemar``).

**Totals only** (:class:`TotalsBounds`): every 2x2 table with the published margins is a possible
pairing (baseline-only ``b`` from ``max(0, A - B)`` to ``min(A, n - B)``, ``c = b - (A - B)``); over
them, the range of exact McNemar p, of disagreement, the loss found with 80 % power, and the unpaired
Newcombe hybrid score interval (statsmodels' ``confint_proportions_2indep(method="newcomb")``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.proportion import confint_proportions_2indep

from kvstudy.errors import StudyError
from kvstudy.stats.binary import ALPHA, TARGET_POWER, DifferenceInterval, mcnemar_p_values

# --------------------------------------------------------------------------- power (paired)


def _critical_counts(d: np.ndarray, alpha: float) -> np.ndarray:
    """For each discordant count d, the largest k with 2 * P(Bin(d, 1/2) <= k) <= alpha (-1: none).

    The exact McNemar test rejects when min(b, c) <= k, which is statsmodels' p-value <= alpha.
    """
    k = sps.binom.ppf(alpha / 2, d, 0.5)
    k = np.where(sps.binom.cdf(k, d, 0.5) * 2 > alpha + 1e-12, k - 1, k)
    return np.where(d > 0, k, -1).astype(np.int64)


def paired_power(n: int, loss: float, discordance: float, alpha: float = ALPHA) -> float:
    """Exact power of the two-sided exact McNemar test to detect an accuracy ``loss`` (fraction).

    ``discordance`` is the expected fraction of items where the two runs disagree; it must be
    at least ``|loss|`` (a loss needs that many more baseline-only than candidate-only items).
    """
    if n <= 0:
        raise StudyError(f"paired_power: n must be positive, got {n}")
    loss = abs(loss)
    if not 0 < discordance <= 1:
        raise StudyError(f"paired_power: discordance must be in (0, 1], got {discordance}")
    if loss > discordance + 1e-12:
        raise StudyError(
            f"paired_power: a loss of {loss:.4f} needs a discordance rate of at least that much, got {discordance:.4f}"
        )
    # only the discordant counts with any probability mass (the rest add < 1e-12 to the power)
    lo = int(sps.binom.ppf(1e-13, n, discordance))
    hi = int(sps.binom.isf(1e-13, n, discordance)) if discordance < 1 else n
    d = np.arange(max(lo - 1, 0), min(hi + 1, n) + 1)
    weights = sps.binom.pmf(d, n, discordance)
    k = _critical_counts(d, alpha)
    pi = min(1.0, (1 + loss / discordance) / 2)  # chance a discordant item favours the baseline
    # reject when the baseline-only count b <= k or >= d - k
    low = np.where(k >= 0, sps.binom.cdf(k, d, pi), 0.0)
    high = np.where(k >= 0, sps.binom.sf(d - k - 1, d, pi), 0.0)
    return float(np.sum(weights * (low + high)))


def smallest_passing(passes: Callable[[float], bool], hi: float, tol: float) -> float | None:
    """The smallest x in (0, hi] at which ``passes`` holds (it holds from some x on), by bisection to
    ``tol``; None when it fails even at ``hi``."""
    if not passes(hi):
        return None
    lo = 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi


def smallest_detectable_loss(
    n: int, discordance: float, power: float = TARGET_POWER, alpha: float = ALPHA
) -> float | None:
    """The smallest loss (fraction) the paired exact test finds with ``power`` on n items, to 0.001
    point (power rises with the loss at a fixed discordance). ``None`` when even the largest loss this
    discordance allows (every disagreement against the candidate) is found with less than ``power``.
    """
    return smallest_passing(lambda loss: paired_power(n, loss, discordance, alpha) >= power, discordance, 1e-5)


# --------------------------------------------------------------------------- totals only


def check_totals(n: object, baseline: object, candidate: object) -> tuple[int, int, int]:
    """Whole numbers (a bool is not one) with 0 <= baseline, candidate <= n and n > 0, or a StudyError
    naming the field."""
    for where, value in (("n", n), ("baseline", baseline), ("candidate", candidate)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise StudyError(f"{where}: expected a whole number >= 0, got {value!r}")
    n_i, a, b = int(n), int(baseline), int(candidate)  # type: ignore[call-overload]
    if n_i == 0:
        raise StudyError("n: expected a positive number of items, got 0")
    for name, value in (("baseline", a), ("candidate", b)):
        if value > n_i:
            raise StudyError(f"{name}: expected a count of correct items between 0 and n = {n_i}, got {value}")
    return n_i, a, b


def power_floor(n: int, power: float, alpha: float) -> float | None:
    """Smallest disagreement rate at which any loss is found with ``power`` (None: not at this n);
    power with every disagreement one way rises with the rate."""
    return smallest_passing(lambda rate: rate > 0 and paired_power(n, rate, rate, alpha) >= power, 1.0, 1e-6)


@dataclass(frozen=True)
class TotalsBounds:
    """What published totals (n, baseline and candidate correct) allow, over every pairing."""

    n: int
    baseline: int
    candidate: int
    discordant_min: int
    discordant_max: int
    mcnemar_p_min: float
    mcnemar_p_max: float
    detectable_loss_low: float | None  # at the lowest usable disagreement rate (fraction)
    detectable_loss_high: float | None  # at the highest disagreement rate
    power_floor: float | None  # below this disagreement rate no loss is found with power
    unpaired: DifferenceInterval
    power: float
    alpha: float

    @property
    def difference(self) -> float:
        """Candidate minus baseline accuracy (a fraction)."""
        return (self.candidate - self.baseline) / self.n

    @property
    def disagreement_min(self) -> float:
        return self.discordant_min / self.n

    @property
    def disagreement_max(self) -> float:
        return self.discordant_max / self.n


def totals_bounds(
    n: int, baseline: int, candidate: int, power: float = TARGET_POWER, alpha: float = ALPHA
) -> TotalsBounds:
    """The range of exact McNemar p, disagreement and detectable loss over all pairings."""
    n, a, b = check_totals(n, baseline, candidate)
    only_a = np.arange(max(0, a - b), min(a, n - b) + 1)  # every pairing the totals allow
    only_b = only_a - (a - b)
    p = mcnemar_p_values(only_a, only_b)
    d = only_a + only_b
    d_min, d_max = int(d.min()), int(d.max())
    floor = power_floor(n, power, alpha)
    low = high = None
    if floor is not None and d_max > 0 and d_max / n >= floor:
        # the exact test is discrete, so the loss need not grow with the rate: take the range's extremes
        ends = [smallest_detectable_loss(n, rate, power, alpha) for rate in (max(d_min / n, floor), d_max / n)]
        found = [x for x in ends if x is not None]
        if found:
            low, high = min(found), max(found)
    low_u, high_u = confint_proportions_2indep(b, n, a, n, method="newcomb", compare="diff", alpha=alpha)
    unpaired = DifferenceInterval((b - a) / n, float(low_u), float(high_u), alpha, "Newcombe hybrid score, unpaired")
    return TotalsBounds(n, a, b, d_min, d_max, float(p.min()), float(p.max()), low, high, floor, unpaired, power, alpha)


def non_inferiority_questions(
    margin: float, discordance: float, power: float = TARGET_POWER, alpha: float = ALPHA
) -> int:
    """Questions a paired non-inferiority test at ``margin`` (fraction) needs to pass with ``power``
    when the two configurations truly score alike and disagree on a share ``discordance`` of the
    questions: the lower limit of the two-sided (1 - alpha) interval of the difference must clear
    -margin; the difference's variance per question is about the discordance, so
    N = ((z_(1-alpha/2) + z_power) / margin)^2 x discordance (normal approximation)."""
    if not 0 < margin < 1:
        raise StudyError(f"margin: expected a fraction of the questions in (0, 1), got {margin!r}")
    if not 0 < discordance <= 1:
        raise StudyError(f"discordance: expected a share of the questions in (0, 1], got {discordance!r}")
    z = float(sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power))
    return int(math.ceil((z / margin) ** 2 * discordance))
