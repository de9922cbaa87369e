"""Tests and intervals of right/wrong outcomes: one function and one typed result per test.

Two runs asked the same items are compared item by item; results are frozen dataclasses of
fractions (not percent) and p-values, never sentences. Wilson and Clopper-Pearson intervals are
statsmodels' ``proportion_confint``; the exact McNemar p is scipy's binomial distribution
(vectorised for the totals bounds; the number ``mcnemar(exact=True)`` and ``binomtest`` give).

Written here because no library has them: **Newcombe's paired interval** of the difference
(method 10: the Wilson intervals of the two marginals combined by "square and add" with the phi
correlation of the pair, phi adjusted toward 0 by n/2; R. G. Newcombe, Statistics in Medicine 17
(1998) 2635-2650; not exact), and the **Poisson-binomial** tail of the chance check, exact far below
1e-16. Non-inferiority at a margin ``m`` is the interval's lower limit above ``-m`` (a one-sided
test at 2.5 %); a margin can be a share of the 16-bit score (MLPerf's "99 % of the reference").
Overlapping Wilson intervals are never used as a test.

**Clustered mean** (:func:`clustered_mean`): items that share a context (several needles in one
haystack, the tokens of one prompt) are not independent: the per-item residuals are summed per
cluster and the variance is ``G/(G-1) * sum_g S_g^2 / n^2``, with a t interval and a two-sided t test
of mean = 0 on G - 1 degrees of freedom. It is the standard error of statsmodels'
``OLS(...).fit(cov_type="cluster", use_t=True)`` on a constant (the tests check that), written out so
that items all scored alike give an error of exactly 0 (a least-squares fit leaves rounding residue
there): with no variation the interval is the mean itself and p is 1 at a mean of 0, else 0. With
fewer than two clusters there is no clustered error: it, the interval and p are NaN. With one item
per cluster it equals the ordinary standard error.

**Many tests in one report** (:func:`holm`): Holm's step-down adjustment keeps the family-wise
false-claim rate <= alpha over the tests of one report (statsmodels' ``multipletests``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from kvstudy.errors import StudyError

ALPHA = 0.05
TARGET_POWER = 0.80
DEFAULT_MARGIN_SHARE = 0.99  # MLPerf-style: the candidate keeps 99 % of the 16-bit score
MULTIPLICITY_METHOD = "Holm (step-down), family-wise false-claim rate <= alpha over the tests of one report"


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class WilsonInterval:
    """One run's accuracy on n items with its Wilson score interval (fractions)."""

    correct: int
    n: int
    low: float
    high: float
    alpha: float = ALPHA

    @property
    def accuracy(self) -> float:
        return self.correct / self.n


def wilson_interval(correct: int, n: int, alpha: float = ALPHA) -> WilsonInterval:
    """Wilson score interval for ``correct`` successes out of ``n``."""
    low, high = proportion_confint(correct, n, alpha=alpha, method="wilson")
    return WilsonInterval(correct, n, float(low), float(high), alpha)


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson (exact binomial) interval of a rate; its upper end at ``level``
    0.90 is the one-sided 95 % upper bound."""
    low, high = proportion_confint(successes, trials, alpha=1.0 - level, method="beta")
    return float(low), float(high)


# --------------------------------------------------------------------------- the paired table


@dataclass(frozen=True)
class PairedCounts:
    """The 2x2 table of two runs on the same n items (baseline = the 16-bit run)."""

    both_right: int
    baseline_only: int
    candidate_only: int
    both_wrong: int

    @property
    def n(self) -> int:
        return self.both_right + self.baseline_only + self.candidate_only + self.both_wrong

    @property
    def baseline_correct(self) -> int:
        return self.both_right + self.baseline_only

    @property
    def candidate_correct(self) -> int:
        return self.both_right + self.candidate_only

    @property
    def discordant(self) -> int:
        return self.baseline_only + self.candidate_only

    @property
    def difference(self) -> float:
        """Candidate minus baseline accuracy (a fraction; negative = a loss)."""
        return (self.candidate_only - self.baseline_only) / self.n


def paired_counts(
    baseline: Mapping[Any, bool], candidate: Mapping[Any, bool], where: str = "paired items"
) -> PairedCounts:
    """The 2x2 table from per-item correctness keyed by item id (e.g. lm-eval's doc_id); both runs
    must cover the same ids."""
    if set(baseline) != set(candidate):
        only_a = sorted(set(baseline) - set(candidate))[:5]
        only_b = sorted(set(candidate) - set(baseline))[:5]
        raise StudyError(
            f"{where}: the two runs must cover the same questions; doc_ids only in "
            f"the baseline {only_a}, only in the other {only_b} (first 5 shown)"
        )
    if not baseline:
        raise StudyError(f"{where}: no questions to compare")
    cells = Counter((bool(right), bool(candidate[item])) for item, right in baseline.items())
    return PairedCounts(cells[True, True], cells[True, False], cells[False, True], cells[False, False])


# --------------------------------------------------------------------------- exact McNemar


def mcnemar_p_values(baseline_only: npt.ArrayLike, candidate_only: npt.ArrayLike) -> np.ndarray:
    """Two-sided exact McNemar p for arrays of discordant counts (1.0 where none is discordant)."""
    b, c = np.asarray(baseline_only), np.asarray(candidate_only)
    d = b + c
    p = np.minimum(1.0, 2.0 * sps.binom.cdf(np.minimum(b, c), d, 0.5))
    return np.where(d == 0, 1.0, p)


def mcnemar_exact(baseline_only: int, candidate_only: int) -> float:
    """The two-sided exact McNemar p of ``baseline_only`` against ``candidate_only`` discordant items."""
    return float(mcnemar_p_values(baseline_only, candidate_only))


# --------------------------------------------------------------------------- interval of the difference


@dataclass(frozen=True)
class DifferenceInterval:
    """An interval of candidate minus baseline accuracy (fractions, clipped to [-1, 1])."""

    difference: float
    low: float
    high: float
    alpha: float
    method: str  # "Newcombe, paired" or "Newcombe hybrid score, unpaired"


def _newcombe_phi(counts: PairedCounts) -> float:
    """Newcombe's (1998, paired) phi with its adjustment of ``ad - bc`` toward 0 by n/2."""
    a, b, c, d = counts.both_right, counts.baseline_only, counts.candidate_only, counts.both_wrong
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        return 0.0
    cross: float = a * d - b * c
    if cross > counts.n / 2:
        cross -= counts.n / 2
    elif cross >= 0:
        cross = 0.0
    return cross / math.sqrt(margins)


def newcombe_paired_interval(counts: PairedCounts, alpha: float = ALPHA) -> DifferenceInterval:
    """Newcombe's method 10 interval for candidate minus baseline accuracy on paired items."""
    n = counts.n
    p1, p2 = counts.candidate_correct / n, counts.baseline_correct / n
    one, two = wilson_interval(counts.candidate_correct, n, alpha), wilson_interval(counts.baseline_correct, n, alpha)
    l1, u1, l2, u2 = one.low, one.high, two.low, two.high
    phi = _newcombe_phi(counts)
    theta = p1 - p2
    down = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    up = (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2
    low = max(-1.0, theta - math.sqrt(max(down, 0.0)))
    high = min(1.0, theta + math.sqrt(max(up, 0.0)))
    return DifferenceInterval(theta, low, high, alpha, "Newcombe, paired")


# --------------------------------------------------------------------------- non-inferiority


@dataclass(frozen=True)
class NonInferiority:
    """Is the candidate no worse than the baseline by more than ``margin``?"""

    margin: float  # fraction; 0 when a share of a 16-bit score of 0 set it
    ci_low: float | None  # the lower limit judged (None: no interval to judge)
    non_inferior: bool | None  # None: not judged (no interval, or a margin of 0)
    share: float | None = None  # the share of the 16-bit score that set the margin, if one did

    @property
    def margin_points(self) -> float:
        return 100 * self.margin

    @property
    def share_pct(self) -> float | None:
        return None if self.share is None else 100 * self.share


def resolve_margin(
    baseline_accuracy: float, margin_points: float | None = None, margin_share: float | None = None
) -> float:
    """The non-inferiority margin as a fraction: from points, or from a share of the 16-bit score.

    With neither given, MLPerf's 99 % of the baseline score is used.
    """
    if margin_points is not None and margin_share is not None:
        raise StudyError("margin: give it in points or as a share of the 16-bit score, not both")
    if margin_points is not None:
        if not (isinstance(margin_points, (int, float)) and 0 < margin_points < 100):  # NaN fails the bounds
            raise StudyError(f"margin_points: expected a number of points in (0, 100), got {margin_points!r}")
        return float(margin_points) / 100
    share = DEFAULT_MARGIN_SHARE if margin_share is None else margin_share
    if not (isinstance(share, (int, float)) and 0 < share < 1):
        raise StudyError(f"margin_share: expected a share of the 16-bit score in (0, 1), e.g. 0.99, got {share!r}")
    return (1 - float(share)) * float(baseline_accuracy)


def non_inferiority(ci_low: float | None, margin: float, share: float | None = None) -> NonInferiority:
    """One-sided test at alpha/2: the interval's lower limit lies above minus the margin; not judged
    (None) without an interval or at a margin of 0.
    """
    judged = ci_low is not None and margin > 0
    return NonInferiority(margin, ci_low, (ci_low > -margin) if judged and ci_low is not None else None, share)


# --------------------------------------------------------------------------- the paired comparison


@dataclass(frozen=True)
class PairedComparison:
    """A candidate against the 16-bit baseline on the same items: the table, the exact McNemar
    test, Newcombe's paired interval and non-inferiority at a margin judged on it."""

    baseline: str  # labels
    candidate: str
    counts: PairedCounts
    mcnemar_p: float  # two-sided exact McNemar p (1.0 when no item is discordant)
    interval: DifferenceInterval
    non_inferiority: NonInferiority
    alpha: float

    @property
    def difference(self) -> float:
        return self.counts.difference


def compare(
    baseline: Mapping[Any, bool],
    candidate: Mapping[Any, bool],
    *,
    margin_points: float | None = None,
    margin_share: float | None = None,
    baseline_label: str = "16-bit",
    candidate_label: str = "candidate",
    alpha: float = ALPHA,
) -> PairedComparison:
    """The paired comparison from per-item correctness keyed by item id (e.g. lm-eval doc_id)."""
    counts = paired_counts(baseline, candidate, f"{candidate_label} vs {baseline_label}")
    margin = resolve_margin(counts.baseline_correct / counts.n, margin_points, margin_share)
    interval = newcombe_paired_interval(counts, alpha)
    p = mcnemar_exact(counts.baseline_only, counts.candidate_only)
    return PairedComparison(
        baseline_label, candidate_label, counts, p, interval, non_inferiority(interval.low, margin), alpha
    )


# --------------------------------------------------------------------------- discrimination


@dataclass(frozen=True)
class Discrimination:
    """Does the eval separate the model from a weak baseline on the same items?"""

    model: str  # labels
    weak: str
    model_correct: int
    weak_correct: int
    n: int
    p_value: float  # one-sided exact paired test that the model beats the weak baseline
    alpha: float = ALPHA

    @property
    def discriminates(self) -> bool:
        return self.p_value < self.alpha


def discrimination_check(
    model_label: str, model: Mapping[Any, bool], weak_label: str, weak: Mapping[Any, bool], alpha: float = ALPHA
) -> Discrimination:
    """One-sided exact McNemar test (paired, same items) that the model beats the weak one."""
    counts = paired_counts(model, weak, f"discrimination {model_label} vs {weak_label}")
    only_model, d = counts.baseline_only, counts.discordant
    p = 1.0 if d == 0 else float(sps.binom.sf(only_model - 1, d, 0.5))
    return Discrimination(
        model_label, weak_label, counts.baseline_correct, counts.candidate_correct, counts.n, p, alpha
    )


# --------------------------------------------------------------------------- better than chance


@dataclass(frozen=True)
class ChanceCheck:
    """Is the count of right answers above what picking at random would give?"""

    label: str
    right: int
    n: int
    expected: float  # items right by chance, on average
    chance_min: float  # the smallest and largest chance of one item
    chance_max: float
    p_value: float  # one-sided exact Poisson-binomial test
    alpha: float = ALPHA

    @property
    def better_than_chance(self) -> bool:
        return self.n > 0 and self.p_value < self.alpha


def chance_check(label: str, outcomes: Sequence[bool], chances: Sequence[float], alpha: float = ALPHA) -> ChanceCheck:
    """One-sided exact test of the count right against independent picks with these chances (one per
    item; its false-claim rate under that null is at most ``alpha``); no items: p = 1, not better.

    The Poisson-binomial distribution is built by convolution (one item at a time) and its upper tail
    summed directly, so a p far below 1e-16 keeps its value (scipy's ``poisson_binom.sf`` is 1 - cdf
    there and stops at the floating-point floor, about 3e-16)."""
    if not outcomes:
        return ChanceCheck(label, 0, 0, 0.0, 0.0, 0.0, 1.0, alpha)
    pmf = np.array([1.0])
    for q in chances:
        pmf = np.concatenate([pmf * (1.0 - q), [0.0]]) + np.concatenate([[0.0], pmf * q])
    right = sum(outcomes)
    p = float(min(1.0, pmf[right:].sum()))
    return ChanceCheck(label, right, len(outcomes), sum(chances), min(chances), max(chances), p, alpha)


# --------------------------------------------------------------------------- clustered items


@dataclass(frozen=True)
class ClusteredMean:
    """A mean over items with an independent and a cluster-robust standard error."""

    n: int
    clusters: int
    mean: float
    se_independent: float
    se_clustered: float  # NaN with fewer than two clusters
    ci_low: float  # t interval on clusters - 1 degrees of freedom, clustered error
    ci_high: float
    p_value: float  # two-sided t test of mean = 0 (NaN with fewer than two clusters)

    @property
    def varies(self) -> bool:
        """False when the clustered error is 0 (e.g. every item scored alike) or NaN: no interval then."""
        return self.se_clustered > 0

    @property
    def design_effect(self) -> float:
        """Variance inflation from clustering (1 when the items behave as independent)."""
        if self.se_independent == 0:
            return 1.0 if self.se_clustered == 0 else math.inf
        return (self.se_clustered / self.se_independent) ** 2


def clustered_mean(
    values: Sequence[float] | npt.NDArray[np.float64],
    clusters: Sequence[Hashable] | npt.NDArray[np.str_],
    alpha: float = ALPHA,
) -> ClusteredMean:
    """Mean of per-item values with the cluster-robust (sandwich) standard error, interval and p."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) != len(clusters):
        raise StudyError(f"clusters: expected one cluster id per item, got {len(clusters)} ids for {x.size} items")
    if x.size == 0:
        raise StudyError("clustered mean: no values")
    if not np.all(np.isfinite(x)):
        raise StudyError("clustered mean: values are not all finite")
    _, index = np.unique(np.asarray([repr(c) for c in clusters]), return_inverse=True)
    groups = int(index.max()) + 1
    n, mean = len(x), float(x.mean())
    resid = x - mean
    se_ind = math.sqrt(float(resid @ resid) / (n * (n - 1))) if n > 1 else 0.0
    if groups < 2 and se_ind > 0:
        nan = math.nan
        return ClusteredMean(n, groups, mean, se_ind, nan, nan, nan, nan)
    sums = np.bincount(index, weights=resid, minlength=groups)
    se_cl = math.sqrt(groups / (groups - 1) * float(sums @ sums)) / n if groups > 1 else 0.0
    if se_cl == 0:
        return ClusteredMean(n, groups, mean, se_ind, se_cl, mean, mean, 1.0 if mean == 0.0 else 0.0)
    t = float(sps.t.ppf(1 - alpha / 2, groups - 1))
    p = float(2 * sps.t.sf(abs(mean / se_cl), groups - 1))
    return ClusteredMean(n, groups, mean, se_ind, se_cl, mean - t * se_cl, mean + t * se_cl, p)


def clustered_difference(
    baseline: Mapping[Any, bool],
    candidate: Mapping[Any, bool],
    cluster_of: Mapping[Any, Hashable],
    alpha: float = ALPHA,
) -> ClusteredMean:
    """Candidate minus baseline accuracy over paired items, clustered by shared context (at least
    two contexts)."""
    paired_counts(baseline, candidate, "clustered difference")  # same ids, not empty
    missing = [k for k in baseline if k not in cluster_of]
    if missing:
        raise StudyError(
            f"clusters: no cluster id for items {sorted(map(str, missing))[:5]} (first 5 shown); expected one per item"
        )
    ids = list(baseline)
    if len({repr(cluster_of[k]) for k in ids}) < 2:
        raise StudyError("clusters: all items share one cluster; a clustered error needs at least 2")
    diffs = [float(bool(candidate[k])) - float(bool(baseline[k])) for k in ids]
    return clustered_mean(diffs, [cluster_of[k] for k in ids], alpha)


# --------------------------------------------------------------------------- many tests


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given (each capped at 1)."""
    if not p_values:
        return []
    adjusted = multipletests(np.asarray(p_values, dtype=float), method="holm")[1]
    return [float(q) for q in adjusted]
