"""kvstudy.stats.binary_power: exact power of the paired test, and what published totals allow."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar

from kvstudy.errors import StudyError
from kvstudy.stats import binary as stats
from kvstudy.stats import binary_power as totals

# --------------------------------------------------------------------------- power


def test_power_against_simulation() -> None:
    """The exact power equals the rejection rate of statsmodels' own test on simulated pairs."""
    n, loss, psi = 120, 0.06, 0.12
    rng = np.random.default_rng(20261129)
    p_only_base, p_only_other = (psi + loss) / 2, (psi - loss) / 2
    trials, rejected = 4000, 0
    for _ in range(trials):
        cells = rng.multinomial(n, [0.5, p_only_base, p_only_other, 0.5 - psi])
        table = [[cells[0], cells[1]], [cells[2], cells[3]]]
        if cells[1] + cells[2] and mcnemar(np.array(table), exact=True).pvalue <= stats.ALPHA:
            rejected += 1
    simulated = rejected / trials
    exact = totals.paired_power(n, loss, psi)
    se = math.sqrt(exact * (1 - exact) / trials)
    assert abs(simulated - exact) < 4 * se, (simulated, exact)


def test_power_hand_calc_single_discordance() -> None:
    # discordance 1: every item is discordant, d = n = 10 exactly; the test rejects when
    # min(b, c) <= 1 (2 * 11/1024 = 0.0215 <= 0.05; k = 2 gives 0.109). With loss 0.6,
    # pi = 0.8: power = P(b <= 1) + P(b >= 9) for b ~ Bin(10, 0.8).
    pi = 0.8
    hand = sum(math.comb(10, k) * pi**k * (1 - pi) ** (10 - k) for k in (0, 1, 9, 10))
    assert totals.paired_power(10, 0.6, 1.0) == pytest.approx(hand)


def test_smallest_detectable_loss_has_the_target_power() -> None:
    mde = totals.smallest_detectable_loss(500, 0.05)
    assert mde is not None and 0 < mde < 0.05
    assert totals.paired_power(500, mde, 0.05) >= 0.8
    assert totals.paired_power(500, mde * 0.95, 0.05) < 0.8


def test_smallest_detectable_loss_none_when_too_few_discordant() -> None:
    # 20 items with 5% discordance: about one discordant item, never significant
    assert totals.smallest_detectable_loss(20, 0.05) is None


def test_detectable_loss_rises_with_disagreement() -> None:
    losses = [totals.smallest_detectable_loss(500, r) for r in (0.02, 0.04, 0.08, 0.12, 0.176)]
    assert all(x is not None for x in losses)
    assert losses == sorted(losses)  # type: ignore[type-var]


def test_power_rejects_impossible_loss() -> None:
    with pytest.raises(StudyError, match="discordance"):
        totals.paired_power(500, 0.1, 0.05)


# --------------------------------------------------------------------------- totals only


def brute_force_pairings(n: int, a: int, b: int) -> list[tuple[int, int]]:
    """Every 2x2 table with row total a (baseline right) and column total b, by enumeration."""
    tables = []
    for both in range(n + 1):
        only_a, only_b = a - both, b - both
        wrong = n - both - only_a - only_b
        if min(only_a, only_b, wrong) >= 0:
            tables.append((only_a, only_b))
    return tables


def test_totals_published_figures() -> None:
    kv = totals.totals_bounds(500, 459, 454)  # FP8 KV cache, published
    weights = totals.totals_bounds(500, 459, 453)  # FP8 weights, published
    assert kv.mcnemar_p_min == pytest.approx(0.0625, rel=1e-12)
    assert weights.mcnemar_p_min == pytest.approx(0.03125, rel=1e-12)
    assert (kv.discordant_min, kv.discordant_max) == (5, 87)
    assert (weights.discordant_min, weights.discordant_max) == (6, 88)  # 1.2 % to 17.6 %
    assert kv.mcnemar_p_max == pytest.approx(stats.mcnemar_exact(46, 41))
    assert kv.difference == pytest.approx(-0.01)


def test_totals_detectable_loss_over_the_disagreement_range() -> None:
    t = totals.totals_bounds(500, 459, 453)
    # the high end: 5.4 points at 17.6 % disagreement
    assert t.detectable_loss_high is not None and t.detectable_loss_low is not None and t.power_floor is not None
    assert round(100 * t.detectable_loss_high, 1) == 5.4
    assert t.detectable_loss_high == pytest.approx(totals.smallest_detectable_loss(500, 0.176))
    # the low end: below ~1.6 % disagreement no loss at all is found with 80 % power at n = 500
    # (even with every disagreement one way); there the detectable loss is ~1.6 points; at 2 %
    # disagreement it is 1.8.
    assert t.power_floor == pytest.approx(0.0158, abs=5e-4)
    assert totals.paired_power(500, t.power_floor, t.power_floor) >= 0.8
    assert totals.paired_power(500, t.power_floor - 1e-3, t.power_floor - 1e-3) < 0.8
    assert round(100 * t.detectable_loss_low, 1) == 1.6
    assert round(100 * (totals.smallest_detectable_loss(500, 0.02) or 0), 1) == 1.8


@pytest.mark.parametrize("n, a, b", [(12, 7, 5), (10, 10, 3), (9, 0, 0), (15, 8, 8), (7, 2, 6)])
def test_totals_match_brute_force_enumeration(n: int, a: int, b: int) -> None:
    tables = brute_force_pairings(n, a, b)
    ps = [stats.mcnemar_exact(x, y) for x, y in tables]
    t = totals.totals_bounds(n, a, b)
    assert t.mcnemar_p_min == pytest.approx(min(ps))
    assert t.mcnemar_p_max == pytest.approx(max(ps))
    assert t.discordant_min == min(x + y for x, y in tables)
    assert t.discordant_max == max(x + y for x, y in tables)


def test_totals_unpaired_interval_is_statsmodels_newcombe() -> None:
    from statsmodels.stats.proportion import confint_proportions_2indep

    t = totals.totals_bounds(500, 459, 454)
    low, high = confint_proportions_2indep(454, 500, 459, 500, method="newcomb")
    assert (t.unpaired.low, t.unpaired.high) == pytest.approx((low, high))
    assert t.unpaired.low < -0.01 < t.unpaired.high
    # the report's figures: -4.5 to +2.5 points
    assert (round(100 * t.unpaired.low, 1), round(100 * t.unpaired.high, 1)) == (-4.5, 2.5)


def test_paired_interval_narrower_than_unpaired_when_runs_agree() -> None:
    counts = stats.PairedCounts(450, 9, 4, 37)
    paired = stats.newcombe_paired_interval(counts)
    unpaired = totals.totals_bounds(counts.n, counts.baseline_correct, counts.candidate_correct).unpaired
    assert paired.high - paired.low < unpaired.high - unpaired.low
    assert unpaired.difference == pytest.approx(counts.difference)


def test_totals_small_n_has_no_detectable_loss() -> None:
    t = totals.totals_bounds(5, 3, 2)
    assert t.detectable_loss_low is None and t.detectable_loss_high is None


@pytest.mark.parametrize(
    "n, a, b, field",
    [
        (500, 501, 3, "baseline"),
        (500, 3, -1, "candidate"),
        (0, 0, 0, "n"),
        (500, 4.5, 3, "baseline"),
        (500, True, 3, "baseline"),
        ("500", 3, 3, "n"),
    ],
)
def test_totals_refuse_bad_counts(n: object, a: object, b: object, field: str) -> None:
    with pytest.raises(StudyError, match=f"^{field}:"):
        totals.totals_bounds(n, a, b)  # type: ignore[arg-type]
