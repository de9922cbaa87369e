"""Paired accuracy verdicts: two runs on the same questions, or only their published totals.

Everything is a pure function of per-item outcomes (or of counts) and is tested without a server.

* **Exact McNemar** (two-sided): given ``d`` discordant items (one run right, the other wrong),
  the items only the baseline got right are ``Binomial(d, 1/2)`` under "no difference"; the
  p-value is ``min(1, 2 * P(X <= min(b, c)))``. This is the same number as
  :func:`kvstudy.accuracy.stats.mcnemar_exact_p` (statsmodels) and ``scipy.stats.binomtest``.
* **Interval of the paired difference**: Newcombe's method 10 for paired data, the Wilson score
  interval of each marginal proportion combined by "square and add" with the phi correlation of
  the pair (phi with Newcombe's adjustment: ``ad - bc`` above ``n/2`` is reduced by ``n/2``,
  between 0 and ``n/2`` counts as 0, negative is kept). Paper: R. G. Newcombe, "Improved
  confidence intervals for the difference between binomial proportions based on paired data",
  Statistics in Medicine 17 (1998) 2635-2650. Not an exact interval.
* **Non-inferiority** at a margin ``m`` (a fraction: points / 100): the candidate is non-inferior
  when the lower limit of the two-sided 95 % interval is above ``-m``, which is a one-sided test
  at 2.5 % (confidence-interval inversion). A margin can be given in points or as a share of the
  16-bit score (MLPerf's "99 % of the reference": ``m = (1 - 0.99) * baseline accuracy``).
* **Totals only** (n, baseline correct A, candidate correct B, no pairing known): every 2x2 table
  with those margins is a possible pairing; its baseline-only count ``b`` runs over
  ``max(0, A - B) .. min(A, n - B)`` with ``c = b - (A - B)``. Over those tables: the range of the
  exact McNemar p, the range of disagreement rates ``(b + c) / n``, the smallest loss the paired
  exact test finds with 80 % power at those rates (``kvstudy.accuracy.stats.paired_power``), and
  the unpaired interval of the difference (Newcombe's hybrid score interval for independent
  proportions, statsmodels ``confint_proportions_2indep(method="newcomb")``; paper: R. G.
  Newcombe, "Interval estimation for the difference between independent proportions: comparison
  of eleven methods", Statistics in Medicine 17 (1998) 873-890).
* **Clustered standard errors**: items that share a context (several needles in one haystack)
  are not independent; the per-item differences are summed per cluster and the sandwich
  (cluster-robust) variance ``G/(G-1) * sum_g S_g^2 / n^2`` is used, with a t interval on G - 1
  degrees of freedom. With one item per cluster it equals the ordinary standard error.

Overlapping Wilson intervals are never used as a test here: two 95 % intervals can overlap while
the paired test finds a clear difference, and the verdict texts say only what the paired test,
the interval of the difference and the margin say.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from kvstudy.accuracy.stats import (
    ALPHA,
    TARGET_POWER,
    paired_power,
    paired_table,
    smallest_detectable_loss,
    wilson_interval,
)
from kvstudy.errors import StudyError

DEFAULT_MARGIN_SHARE = 0.99  # MLPerf-style: the candidate keeps 99 % of the 16-bit score


# --------------------------------------------------------------------------- exact McNemar


def mcnemar_exact(baseline_only: int, candidate_only: int) -> float:
    """Two-sided exact McNemar p: binomial test of the discordant items against 1/2 (1.0 if none)."""
    b, c = _count(baseline_only, "baseline_only"), _count(candidate_only, "candidate_only")
    if b + c == 0:
        return 1.0
    return float(min(1.0, 2.0 * sps.binom.cdf(min(b, c), b + c, 0.5)))


def _mcnemar_vector(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """:func:`mcnemar_exact` for arrays of discordant counts."""
    d = b + c
    p = np.minimum(1.0, 2.0 * sps.binom.cdf(np.minimum(b, c), d, 0.5))
    return np.where(d == 0, 1.0, p)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise StudyError(f"{where}: expected a whole number >= 0, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- paired counts


@dataclass(frozen=True)
class PairedCounts:
    """The 2x2 table of two runs on the same n items (baseline = the 16-bit run)."""

    both_right: int
    baseline_only: int
    candidate_only: int
    both_wrong: int

    def __post_init__(self) -> None:
        for name in ("both_right", "baseline_only", "candidate_only", "both_wrong"):
            _count(getattr(self, name), name)
        if self.n == 0:
            raise StudyError("paired counts: no items to compare")

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
    """Count the 2x2 table from per-item correctness keyed by item id (the same ids in both)."""
    table = paired_table(baseline, candidate, where)  # rows: baseline right?, cols: candidate right?
    return PairedCounts(table[0][0], table[0][1], table[1][0], table[1][1])


# --------------------------------------------------------------------------- intervals


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


def paired_difference_ci(counts: PairedCounts, alpha: float = ALPHA) -> tuple[float, float]:
    """Newcombe's method 10 interval for candidate minus baseline accuracy (fractions)."""
    n = counts.n
    p1, p2 = counts.candidate_correct / n, counts.baseline_correct / n
    l1, u1 = wilson_interval(counts.candidate_correct, n, alpha)
    l2, u2 = wilson_interval(counts.baseline_correct, n, alpha)
    phi = _newcombe_phi(counts)
    theta = p1 - p2
    down = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    up = (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2
    return max(-1.0, theta - math.sqrt(max(down, 0.0))), min(1.0, theta + math.sqrt(max(up, 0.0)))


def unpaired_difference_ci(n: int, baseline: int, candidate: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Newcombe's hybrid score interval for candidate minus baseline, as if the runs were independent."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    low, high = confint_proportions_2indep(candidate, n, baseline, n, method="newcomb", compare="diff", alpha=alpha)
    return float(low), float(high)


# --------------------------------------------------------------------------- non-inferiority


def resolve_margin(
    baseline_accuracy: float, margin_points: float | None = None, margin_share: float | None = None
) -> float:
    """The non-inferiority margin as a fraction: from points, or from a share of the 16-bit score.

    With neither given, MLPerf's 99 % of the baseline score is used.
    """
    if margin_points is not None and margin_share is not None:
        raise StudyError("margin: give it in points or as a share of the 16-bit score, not both")
    if margin_points is not None:
        if not (isinstance(margin_points, (int, float)) and 0 < margin_points < 100 and math.isfinite(margin_points)):
            raise StudyError(f"margin_points: expected a number of points in (0, 100), got {margin_points!r}")
        return float(margin_points) / 100
    share = DEFAULT_MARGIN_SHARE if margin_share is None else margin_share
    if not (isinstance(share, (int, float)) and 0 < share < 1):
        raise StudyError(f"margin_share: expected a share of the 16-bit score in (0, 1), e.g. 0.99, got {share!r}")
    return (1 - float(share)) * float(baseline_accuracy)


def non_inferior(ci_low: float, margin: float) -> bool:
    """One-sided test at alpha/2: the interval's lower limit lies above minus the margin."""
    return ci_low > -margin


# --------------------------------------------------------------------------- the verdict


def _points(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "\u2212")


@dataclass(frozen=True)
class PairedVerdict:
    """A candidate against the 16-bit baseline on the same items, with a plain-language verdict.

    Fractions (not percent) except in ``text`` and :meth:`to_json`.
    """

    baseline_label: str
    candidate_label: str
    counts: PairedCounts
    mcnemar_p: float  # exact, two-sided
    ci_low: float  # 95 % Newcombe (paired) interval of candidate - baseline
    ci_high: float
    margin: float  # non-inferiority margin (fraction)
    non_inferior: bool
    alpha: float
    text: str

    @property
    def difference(self) -> float:
        return self.counts.difference

    def to_json(self) -> dict[str, object]:
        """The keys of ``kvstudy accuracy compare --json`` (interval and margin in points)."""
        c = self.counts
        return {
            "n": c.n,
            "correct": {"baseline": c.baseline_correct, "candidate": c.candidate_correct},
            "discordant": {"baseline_only": c.baseline_only, "candidate_only": c.candidate_only},
            "mcnemar_p": self.mcnemar_p,
            "difference_points": 100 * self.difference,
            "difference_ci": [100 * self.ci_low, 100 * self.ci_high],
            "margin_points": 100 * self.margin,
            "non_inferior": self.non_inferior,
            "verdict": self.text,
        }

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["difference"] = self.difference
        return data


def _verdict_text(
    base: str, cand: str, counts: PairedCounts, p: float, low: float, high: float, margin: float, ok: bool, alpha: float
) -> str:
    c = counts
    level = round(100 * (1 - alpha))
    head = (
        f"{cand}: {c.candidate_correct}/{c.n} against {c.baseline_correct}/{c.n} for {base} "
        f"({_points(c.difference)} points); the runs disagree on {c.discordant} items "
        f"({c.baseline_only} only {base} right, {c.candidate_only} only {cand} right); "
        f"exact McNemar p = {p:.3g}; {level}% interval of the difference (Newcombe, paired) "
        f"{_points(low)} to {_points(high)} points."
    )
    if c.discordant == 0:
        test = " Both runs got exactly the same items right."
    elif p < alpha:
        word = "lower" if c.difference < 0 else "higher"
        test = f" The paired test shows {cand} scoring {word} than {base} at the {100 * alpha:g}% level."
    else:
        test = (
            f" The paired test shows no difference at the {100 * alpha:g}% level, which is not "
            f"proof that there is none."
        )
    if ok:
        ni = (
            f" Non-inferior at a margin of {100 * margin:.2f} points: the interval's lower "
            f"limit ({_points(low)}) is above {_points(-margin)}."
        )
    else:
        ni = (
            f" Non-inferiority at a margin of {100 * margin:.2f} points is not shown: the "
            f"interval reaches down to {_points(low)} points."
        )
    return head + test + ni


def verdict_from_counts(
    counts: PairedCounts,
    margin: float,
    baseline_label: str = "16-bit",
    candidate_label: str = "candidate",
    alpha: float = ALPHA,
) -> PairedVerdict:
    """The paired verdict from a 2x2 table and a margin (fraction)."""
    if not (0 < margin < 1):
        raise StudyError(f"margin: expected a fraction in (0, 1), got {margin!r}")
    p = mcnemar_exact(counts.baseline_only, counts.candidate_only)
    low, high = paired_difference_ci(counts, alpha)
    ok = non_inferior(low, margin)
    text = _verdict_text(baseline_label, candidate_label, counts, p, low, high, margin, ok, alpha)
    return PairedVerdict(baseline_label, candidate_label, counts, p, low, high, margin, ok, alpha, text)


def compare(
    baseline: Mapping[Any, bool],
    candidate: Mapping[Any, bool],
    *,
    margin_points: float | None = None,
    margin_share: float | None = None,
    baseline_label: str = "16-bit",
    candidate_label: str = "candidate",
    alpha: float = ALPHA,
) -> PairedVerdict:
    """Paired verdict from per-item correctness keyed by item id (e.g. lm-eval doc_id)."""
    counts = paired_counts(baseline, candidate, f"{candidate_label} vs {baseline_label}")
    margin = resolve_margin(counts.baseline_correct / counts.n, margin_points, margin_share)
    return verdict_from_counts(counts, margin, baseline_label, candidate_label, alpha)


# --------------------------------------------------------------------------- totals only


def check_totals(n: object, baseline: object, candidate: object) -> tuple[int, int, int]:
    """Whole numbers with 0 <= baseline, candidate <= n and n > 0, or a StudyError naming the field."""
    for name, value in (("n", n), ("baseline", baseline), ("candidate", candidate)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise StudyError(f"{name}: expected a whole number, got {value!r}")
    n_i, a_i, b_i = int(n), int(baseline), int(candidate)  # type: ignore[call-overload]
    if n_i <= 0:
        raise StudyError(f"n: expected a positive number of items, got {n}")
    for name, value in (("baseline", a_i), ("candidate", b_i)):
        if not 0 <= value <= n_i:
            raise StudyError(f"{name}: expected a count of correct items between 0 and n = {n_i}, got {value}")
    return n_i, a_i, b_i


def possible_pairings(n: int, baseline: int, candidate: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (baseline_only, candidate_only) a pairing of the items allows, given the totals."""
    n, a, b = check_totals(n, baseline, candidate)
    gap = a - b
    lo, hi = max(0, gap), min(a, n - b)
    baseline_only = np.arange(lo, hi + 1, dtype=np.int64)
    return baseline_only, baseline_only - gap


def _power_floor(n: int, power: float, alpha: float) -> float | None:
    """Smallest disagreement rate at which any loss is found with ``power`` (None: not at this n)."""
    if paired_power(n, 1.0, 1.0, alpha) < power:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:  # power with every disagreement one way rises with the rate
        mid = (lo + hi) / 2
        if mid > 0 and paired_power(n, mid, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


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
    unpaired_ci_low: float
    unpaired_ci_high: float
    power: float
    alpha: float
    text: str

    @property
    def disagreement_min(self) -> float:
        return self.discordant_min / self.n

    @property
    def disagreement_max(self) -> float:
        return self.discordant_max / self.n

    def to_json(self) -> dict[str, object]:
        """The keys of ``kvstudy accuracy totals --json`` (rates and losses in percent/points)."""

        def pts(x: float | None) -> float | None:
            return None if x is None else 100 * x

        rates = [100 * self.discordant_min / self.n, 100 * self.discordant_max / self.n]
        return {
            "n": self.n,
            "correct": {"baseline": self.baseline, "candidate": self.candidate},
            "mcnemar_p_min": self.mcnemar_p_min,
            "mcnemar_p_max": self.mcnemar_p_max,
            "discordant_range": [self.discordant_min, self.discordant_max],
            "disagreement_rate_pct": rates,
            "detectable_loss_points": [pts(self.detectable_loss_low), pts(self.detectable_loss_high)],
            "power_floor_disagreement_pct": pts(self.power_floor),
            "unpaired_difference_ci": [pts(self.unpaired_ci_low), pts(self.unpaired_ci_high)],
            "verdict": self.text,
        }

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(disagreement_min=self.disagreement_min, disagreement_max=self.disagreement_max)
        return data


def _totals_text(t: TotalsBounds) -> str:
    diff = (t.candidate - t.baseline) / t.n
    level = round(100 * (1 - t.alpha))
    head = (
        f"From totals alone ({t.candidate}/{t.n} against {t.baseline}/{t.n}, "
        f"{_points(diff)} points) the pairing of items is unknown. "
    )
    if t.mcnemar_p_min >= t.alpha:
        test = (
            f"No pairing gives an exact McNemar p below {t.mcnemar_p_min:.3g}, so these totals "
            f"cannot show a difference at the {100 * t.alpha:g}% level whatever the per-item "
            f"records are. "
        )
    else:
        test = (
            f"The exact McNemar p lies between {t.mcnemar_p_min:.3g} and "
            f"{t.mcnemar_p_max:.3g} depending on the pairing; only per-item records can tell "
            f"whether the difference is significant. "
        )
    rates = f"The runs disagree on {100 * t.disagreement_min:.1f}% to {100 * t.disagreement_max:.1f}% of the items"
    pw = f"{100 * t.power:g}%"
    if t.detectable_loss_high is None:
        power = f"{rates}; at none of these rates does the paired exact test find a loss with {pw} power. "
    elif t.power_floor is not None and t.power_floor > t.disagreement_min:
        power = (
            f"{rates}; below {100 * t.power_floor:.1f}% disagreement no loss is found with "
            f"{pw} power, and above it the paired exact test finds only a loss of at least "
            f"{100 * (t.detectable_loss_low or 0):.1f} to {100 * (t.detectable_loss_high or 0):.1f} points. "
        )
    else:
        power = (
            f"{rates}; over that range the paired exact test finds with {pw} power only a "
            f"loss of at least {100 * (t.detectable_loss_low or 0):.1f} to "
            f"{100 * (t.detectable_loss_high or 0):.1f} points. "
        )
    ci = (
        f"The unpaired {level}% interval of the difference (Newcombe hybrid score) is "
        f"{_points(t.unpaired_ci_low)} to {_points(t.unpaired_ci_high)} points."
    )
    return head + test + power + ci


def totals_bounds(
    n: int, baseline: int, candidate: int, power: float = TARGET_POWER, alpha: float = ALPHA
) -> TotalsBounds:
    """The range of exact McNemar p, disagreement and detectable loss over all pairings."""
    n, a, b = check_totals(n, baseline, candidate)
    only_a, only_b = possible_pairings(n, a, b)
    p = _mcnemar_vector(only_a, only_b)
    d = only_a + only_b
    d_min, d_max = int(d.min()), int(d.max())
    floor = _power_floor(n, power, alpha)
    low = high = None
    if floor is not None and d_max > 0 and d_max / n >= floor:
        # the exact test is discrete, so the loss need not grow with the rate: take the range's extremes
        ends = [smallest_detectable_loss(n, rate, power, alpha) for rate in (max(d_min / n, floor), d_max / n)]
        found = [x for x in ends if x is not None]
        if found:
            low, high = min(found), max(found)
    ci_low, ci_high = unpaired_difference_ci(n, a, b, alpha)
    draft = TotalsBounds(
        n, a, b, d_min, d_max, float(p.min()), float(p.max()), low, high, floor, ci_low, ci_high, power, alpha, ""
    )
    return TotalsBounds(**{**asdict(draft), "text": _totals_text(draft)})


# --------------------------------------------------------------------------- clustered errors


@dataclass(frozen=True)
class ClusteredMean:
    """A mean over items with an independent and a cluster-robust standard error."""

    n: int
    clusters: int
    mean: float
    se_independent: float
    se_clustered: float
    ci_low: float  # t interval on clusters - 1 degrees of freedom, clustered error
    ci_high: float

    @property
    def design_effect(self) -> float:
        """Variance inflation from clustering (1 when the items behave as independent)."""
        if self.se_independent == 0:
            return 1.0 if self.se_clustered == 0 else math.inf
        return (self.se_clustered / self.se_independent) ** 2


def clustered_mean(values: Sequence[float], clusters: Sequence[Hashable], alpha: float = ALPHA) -> ClusteredMean:
    """Mean of per-item values with the cluster-robust (sandwich) standard error."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) != len(clusters):
        raise StudyError(f"clusters: expected one cluster id per item, got {len(clusters)} ids for {x.size} items")
    if len(x) < 2:
        raise StudyError(f"clustered mean: expected at least 2 items, got {len(x)}")
    _, index = np.unique(np.asarray([repr(c) for c in clusters]), return_inverse=True)
    groups = int(index.max()) + 1
    if groups < 2:
        raise StudyError("clusters: all items share one cluster; a clustered error needs at least 2")
    n, mean = len(x), float(x.mean())
    resid = x - mean
    se_ind = math.sqrt(float(resid @ resid) / (n * (n - 1)))
    sums = np.bincount(index, weights=resid, minlength=groups)
    se_cl = math.sqrt(groups / (groups - 1) * float(sums @ sums)) / n
    t = float(sps.t.ppf(1 - alpha / 2, groups - 1))
    return ClusteredMean(n, groups, mean, se_ind, se_cl, mean - t * se_cl, mean + t * se_cl)


def clustered_difference(
    baseline: Mapping[Any, bool],
    candidate: Mapping[Any, bool],
    cluster_of: Mapping[Hashable, Hashable],
    alpha: float = ALPHA,
) -> ClusteredMean:
    """Candidate minus baseline accuracy over paired items, clustered by shared context."""
    paired_table(baseline, candidate, "clustered difference")  # same ids, not empty
    missing = [k for k in baseline if k not in cluster_of]
    if missing:
        raise StudyError(
            f"clusters: no cluster id for items {sorted(map(str, missing))[:5]} (first 5 shown); expected one per item"
        )
    ids = list(baseline)
    diffs = [float(bool(candidate[k])) - float(bool(baseline[k])) for k in ids]
    return clustered_mean(diffs, [cluster_of[k] for k in ids], alpha)
