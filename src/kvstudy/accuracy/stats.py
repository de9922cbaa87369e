"""Statistics for the GSM8K accuracy comparison: intervals, paired tests, power, verdicts.

Everything here is a pure function of counts or of per-question correctness, so it is tested
without a server. The tests that statsmodels has are used as they are:

* Wilson 95 % intervals: ``statsmodels.stats.proportion.proportion_confint(method="wilson")``.
* Exact paired McNemar test: ``statsmodels.stats.contingency_tables.mcnemar(exact=True)`` on the
  table ``[[both right, only baseline right], [only other right, both wrong]]``.

Power of the paired design has no statsmodels function, so it is computed here **exactly**, not
by the normal approximation: the exact McNemar test conditions on the number of discordant
questions ``d`` (one configuration right, the other wrong). With a discordance rate ``psi`` and
an accuracy loss ``delta``, ``d ~ Binomial(N, psi)`` and, given ``d``, the questions only the
baseline got right follow ``Binomial(d, (1 + delta/psi) / 2)``. Summing the probability of the
test's rejection region over every ``d`` gives the power of exactly the test the report runs
(same alpha, same two-sided exact p-value). The normal-approximation sample size of Connor (1987)
is kept as a cross-check (``connor_sample_size``); the tests also check the exact power against
a Monte Carlo simulation that calls statsmodels' ``mcnemar`` itself.

The discordance rate is the unknown that a paired design depends on: per-question records give
an estimate; a published summary of counts does not, so power is then shown for assumed rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from kvstudy.errors import StudyError

ALPHA = 0.05
TARGET_POWER = 0.80


# --------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class AccuracyRow:
    """One configuration's score on N questions with its Wilson interval (fractions, not %)."""

    label: str
    correct: int
    n: int
    accuracy: float
    wilson_low: float
    wilson_high: float

    def as_percent_dict(self) -> dict[str, object]:
        return {
            "configuration": self.label,
            "correct": f"{self.correct}/{self.n}",
            "accuracy_pct": round(100 * self.accuracy, 1),
            "wilson95_low_pct": round(100 * self.wilson_low, 1),
            "wilson95_high_pct": round(100 * self.wilson_high, 1),
        }


def _check_count(correct: int, n: int, where: str) -> None:
    if not (isinstance(correct, (int, np.integer)) and isinstance(n, (int, np.integer))):
        raise StudyError(f"{where}: correct and n must be integers, got {correct!r} and {n!r}")
    if n <= 0 or correct < 0 or correct > n:
        raise StudyError(f"{where}: expected 0 <= correct <= n and n > 0, got {correct}/{n}")


def wilson_interval(correct: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval for ``correct`` successes out of ``n`` (fractions)."""
    from statsmodels.stats.proportion import proportion_confint

    _check_count(correct, n, "wilson_interval")
    low, high = proportion_confint(correct, n, alpha=alpha, method="wilson")
    return float(low), float(high)


def accuracy_row(label: str, correct: int, n: int, alpha: float = ALPHA) -> AccuracyRow:
    _check_count(correct, n, f"configuration {label!r}")
    low, high = wilson_interval(correct, n, alpha)
    return AccuracyRow(label, int(correct), int(n), correct / n, low, high)


def intervals_overlap(a: AccuracyRow, b: AccuracyRow) -> bool:
    return a.wilson_low <= b.wilson_high and b.wilson_low <= a.wilson_high


# --------------------------------------------------------------------------- paired test


@dataclass(frozen=True)
class PairedComparison:
    """A configuration against the baseline on the same questions (exact McNemar)."""

    baseline: str
    other: str
    n: int
    both_right: int
    only_baseline_right: int
    only_other_right: int
    both_wrong: int
    p_value: float  # two-sided exact McNemar (binomial on the discordant questions)

    @property
    def baseline_correct(self) -> int:
        return self.both_right + self.only_baseline_right

    @property
    def other_correct(self) -> int:
        return self.both_right + self.only_other_right

    @property
    def discordant(self) -> int:
        return self.only_baseline_right + self.only_other_right

    @property
    def difference(self) -> float:
        """Other minus baseline accuracy (negative = a loss)."""
        return (self.other_correct - self.baseline_correct) / self.n

    @property
    def discordance_rate(self) -> float:
        return self.discordant / self.n

    def table(self) -> list[list[int]]:
        return [[self.both_right, self.only_baseline_right], [self.only_other_right, self.both_wrong]]

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(difference=self.difference, discordance_rate=self.discordance_rate)
        return data


def paired_table(
    baseline: Mapping[Any, bool], other: Mapping[Any, bool], where: str = "paired records"
) -> list[list[int]]:
    """The 2x2 table from per-question correctness keyed by doc_id; both must cover the same ids."""
    if set(baseline) != set(other):
        only_a = sorted(set(baseline) - set(other))[:5]
        only_b = sorted(set(other) - set(baseline))[:5]
        raise StudyError(
            f"{where}: the two runs must cover the same questions; doc_ids only in "
            f"the baseline {only_a}, only in the other {only_b} (first 5 shown)"
        )
    if not baseline:
        raise StudyError(f"{where}: no questions to compare")
    cells = [[0, 0], [0, 0]]
    for doc_id, a_right in baseline.items():
        row = 0 if bool(a_right) else 1
        col = 0 if bool(other[doc_id]) else 1
        cells[row][col] += 1
    # cells[row=baseline right?][col=other right?]; McNemar's layout puts "only other right"
    # at [1][0] and "only baseline right" at [0][1], which is exactly this.
    return cells


def mcnemar_exact_p(table: Sequence[Sequence[int]]) -> float:
    """Two-sided exact McNemar p-value (statsmodels); 1.0 when no question is discordant."""
    from statsmodels.stats.contingency_tables import mcnemar

    b, c = int(table[0][1]), int(table[1][0])
    if b + c == 0:
        return 1.0
    return float(mcnemar(np.asarray(table), exact=True).pvalue)


def compare_paired(
    baseline_label: str, baseline: Mapping[int, bool], other_label: str, other: Mapping[int, bool]
) -> PairedComparison:
    table = paired_table(baseline, other, f"{other_label} vs {baseline_label}")
    return PairedComparison(
        baseline_label,
        other_label,
        sum(map(sum, table)),
        table[0][0],
        table[0][1],
        table[1][0],
        table[1][1],
        mcnemar_exact_p(table),
    )


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

    ``discordance`` is the expected fraction of questions where the two runs disagree; it must be
    at least ``|loss|`` (a loss needs that many more baseline-only than other-only questions).
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
    pi = min(1.0, (1 + loss / discordance) / 2)  # chance a discordant question favours the baseline
    # reject when the baseline-only count b <= k or >= d - k
    low = np.where(k >= 0, sps.binom.cdf(k, d, pi), 0.0)
    high = np.where(k >= 0, sps.binom.sf(d - k - 1, d, pi), 0.0)
    return float(np.sum(weights * (low + high)))


def smallest_detectable_loss(
    n: int, discordance: float, power: float = TARGET_POWER, alpha: float = ALPHA
) -> float | None:
    """The smallest loss (fraction) the paired exact test finds with ``power`` on n questions.

    ``None`` when even the largest loss this discordance allows (loss == discordance, every
    disagreement against the other configuration) is found with less than ``power``.
    """
    if paired_power(n, discordance, discordance, alpha) < power:
        return None
    lo, hi = 0.0, discordance
    while hi - lo > 1e-5:  # power rises with the loss at a fixed discordance: bisect to 0.001 point
        mid = (lo + hi) / 2
        if paired_power(n, mid, discordance, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def connor_sample_size(loss: float, discordance: float, power: float = TARGET_POWER, alpha: float = ALPHA) -> int:
    """Normal-approximation N for the paired design (Connor 1987), a cross-check on the exact one."""
    loss = abs(loss)
    za, zb = sps.norm.ppf(1 - alpha / 2), sps.norm.ppf(power)
    n = (za * math.sqrt(discordance) + zb * math.sqrt(discordance - loss**2)) ** 2 / loss**2
    return int(math.ceil(n))


def required_questions(
    loss: float, discordance: float, power: float = TARGET_POWER, alpha: float = ALPHA, n_max: int = 2_000_000
) -> int:
    """The number of questions the paired exact test needs to find ``loss`` with ``power``.

    Exact power is a slightly saw-toothed function of N, so this bisects on it between bounds
    around Connor's approximation and returns the first N found with power >= ``power``.
    """
    loss = abs(loss)
    if loss <= 0:
        raise StudyError(f"required_questions: the loss must be positive, got {loss}")
    paired_power(1, loss, discordance, alpha)  # validates the arguments
    guess = connor_sample_size(loss, discordance, power, alpha)
    lo, hi = max(1, guess // 2), min(n_max, max(guess * 2, 10))
    while paired_power(hi, loss, discordance, alpha) < power:
        if hi >= n_max:
            raise StudyError(f"required_questions: more than {n_max} questions needed")
        lo, hi = hi, min(n_max, hi * 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if paired_power(mid, loss, discordance, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def independent_sample_size(
    p_baseline: float, p_other: float, power: float = TARGET_POWER, alpha: float = ALPHA
) -> int:
    """Questions per arm for two independent samples (statsmodels), the unpaired upper bound."""
    from statsmodels.stats.power import NormalIndPower
    from statsmodels.stats.proportion import proportion_effectsize

    effect = proportion_effectsize(p_baseline, p_other)
    n = NormalIndPower().solve_power(effect_size=abs(effect), alpha=alpha, power=power, ratio=1.0)
    return int(math.ceil(n))


# --------------------------------------------------------------------------- discrimination


@dataclass(frozen=True)
class Discrimination:
    """Does the eval separate the model from a weak baseline (e.g. zero-shot, random weights)?"""

    model: str
    weak: str
    model_correct: int
    weak_correct: int
    n: int
    p_value: float  # one-sided exact test that the model beats the weak baseline
    discriminates: bool

    def sentence(self) -> str:
        a, b = 100 * self.model_correct / self.n, 100 * self.weak_correct / self.n
        if self.discriminates:
            return (
                f"The eval discriminates: {self.model} scores {a:.1f}% against {b:.1f}% for "
                f"the weak baseline ({self.weak}) on the same {self.n} questions "
                f"(one-sided exact p = {self.p_value:.2g})."
            )
        return (
            f"The eval cannot discriminate here: {self.model} scores {a:.1f}% and the weak "
            f"baseline ({self.weak}) {b:.1f}% on the same {self.n} questions (one-sided exact "
            f"p = {self.p_value:.2g}), so no accuracy difference between configurations can "
            f"be read from it."
        )


def discrimination_check(
    model_label: str, model: Mapping[int, bool], weak_label: str, weak: Mapping[int, bool], alpha: float = ALPHA
) -> Discrimination:
    """One-sided exact McNemar test (paired, same questions) that the model beats the weak one."""
    table = paired_table(model, weak, f"discrimination {model_label} vs {weak_label}")
    only_model, only_weak = table[0][1], table[1][0]
    d = only_model + only_weak
    p = 1.0 if d == 0 else float(sps.binom.sf(only_model - 1, d, 0.5))
    n = sum(map(sum, table))
    return Discrimination(model_label, weak_label, table[0][0] + only_model, table[0][0] + only_weak, n, p, p < alpha)


# --------------------------------------------------------------------------- verdicts


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "\u2212") + " points"


def unpaired_verdict(baseline: AccuracyRow, other: AccuracyRow) -> str:
    """Sentence for two counts without per-question records (intervals only)."""
    diff = other.accuracy - baseline.accuracy
    overlap = intervals_overlap(baseline, other)
    head = f"{other.label}: {other.correct}/{other.n} against {baseline.correct}/{baseline.n} ({_pts(diff)})."
    if overlap:
        return head + (
            " The Wilson intervals overlap, so these counts show no difference; "
            "without per-question records no paired test can be run."
        )
    word = "lower" if diff < 0 else "higher"
    return head + f" The Wilson intervals do not overlap: {other.label} scored {word}."


def paired_verdict(cmp: PairedComparison, mde: float | None, alpha: float = ALPHA) -> str:
    """Sentence for one paired comparison, from its numbers and the smallest detectable loss."""
    head = (
        f"{cmp.other}: {cmp.other_correct}/{cmp.n} against {cmp.baseline_correct}/{cmp.n} "
        f"({_pts(cmp.difference)}); {cmp.discordant} questions differ "
        f"({cmp.only_baseline_right} only {cmp.baseline} right, {cmp.only_other_right} only "
        f"{cmp.other} right); exact McNemar p = {cmp.p_value:.3g}."
    )
    if cmp.discordant == 0:
        return head + " Both runs got exactly the same questions right."
    if cmp.p_value < alpha:
        word = "a loss" if cmp.difference < 0 else "a gain"
        return head + f" This is {word} at the 5% level."
    if mde is None:
        tail = " No difference is shown, and with this discordance no loss is found with 80% power at this N."
    else:
        tail = (
            f" No difference is shown; at this N and discordance only a loss of about "
            f"{100 * mde:.1f} points or more would be found with 80% power."
        )
    return head + tail
