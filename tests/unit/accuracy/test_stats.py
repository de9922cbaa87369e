"""Unit tests of kvstudy.accuracy.stats against published values, hand computation and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar

from kvstudy.accuracy import stats as acc
from kvstudy.errors import StudyError


@pytest.mark.parametrize(
    "correct, low, high",
    [
        (459, 89.1, 93.9),  # seed 000, vLLM BF16
        (453, 87.7, 92.9),  # seed 000, FP8 weights and FP8 weights + FP8 KV
        (454, 87.9, 93.0),  # seed 000, FP8 KV cache
    ],
)
def test_wilson_matches_published_intervals(correct, low, high):
    row = acc.accuracy_row("x", correct, 500)
    assert round(100 * row.wilson_low, 1) == low
    assert round(100 * row.wilson_high, 1) == high


def test_wilson_hand_formula():
    # Wilson score interval written out: (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    k, n, z = 7, 20, 1.959963984540054
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = acc.wilson_interval(k, n)
    assert low == pytest.approx((centre - half) / (1 + z * z / n), abs=1e-12)
    assert high == pytest.approx((centre + half) / (1 + z * z / n), abs=1e-12)


@pytest.mark.parametrize("correct, n", [(-1, 10), (11, 10), (0, 0), (1.5, 10)])
def test_bad_counts_raise(correct, n):
    with pytest.raises(StudyError):
        acc.accuracy_row("cfg", correct, n)


def _records(pattern: str) -> dict[int, bool]:
    return {i: ch == "1" for i, ch in enumerate(pattern)}


def test_paired_table_layout_and_hand_mcnemar():
    base = _records("111110000011")
    other = _records("110001100010")
    cmp = acc.compare_paired("BF16", base, "FP8", other)
    # both right: 0,1,10 -> 3; only base: 2,3,4,11 -> 4; only other: 5,6 -> 2; both wrong: 7,8,9 -> 3
    assert cmp.table() == [[3, 4], [2, 3]]
    assert cmp.baseline_correct == 7 and cmp.other_correct == 5 and cmp.n == 12
    # hand: two-sided exact = 2 * P(Bin(6, 1/2) <= 2) = 2 * (1 + 6 + 15) / 64 = 44/64
    assert cmp.p_value == pytest.approx(44 / 64)
    assert cmp.difference == pytest.approx(-2 / 12)


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (0, 5, 2 / 32),  # 2 * P(X <= 0), X ~ Bin(5, 1/2)
        (1, 9, 2 * (1 + 10) / 1024),  # 2 * P(X <= 1), X ~ Bin(10, 1/2)
        (3, 3, 1.0),  # symmetric: capped at 1
        (2, 10, 2 * (1 + 12 + 66) / 4096),
    ],
)
def test_mcnemar_exact_against_binomial_by_hand(b, c, expected):
    table = [[40, b], [c, 7]]
    assert acc.mcnemar_exact_p(table) == pytest.approx(expected)


def test_no_discordant_questions_gives_p_one():
    assert acc.mcnemar_exact_p([[5, 0], [0, 5]]) == 1.0


def test_paired_table_rejects_different_questions():
    with pytest.raises(StudyError, match="same questions"):
        acc.paired_table({0: True, 1: False}, {0: True, 2: False})


def test_power_against_simulation():
    """The exact power equals the rejection rate of statsmodels' own test on simulated pairs."""
    n, loss, psi = 120, 0.06, 0.12
    rng = np.random.default_rng(20261129)
    p_only_base, p_only_other = (psi + loss) / 2, (psi - loss) / 2
    trials, rejected = 4000, 0
    for _ in range(trials):
        cells = rng.multinomial(n, [0.5, p_only_base, p_only_other, 0.5 - psi])
        table = [[cells[0], cells[1]], [cells[2], cells[3]]]
        if cells[1] + cells[2] and mcnemar(np.array(table), exact=True).pvalue <= acc.ALPHA:
            rejected += 1
    simulated = rejected / trials
    exact = acc.paired_power(n, loss, psi)
    se = math.sqrt(exact * (1 - exact) / trials)
    assert abs(simulated - exact) < 4 * se, (simulated, exact)


def test_power_hand_calc_single_discordance():
    # discordance 1: every question is discordant, d = n = 10 exactly; the test rejects when
    # min(b, c) <= 1 (2 * 11/1024 = 0.0215 <= 0.05; k = 2 gives 0.109). With loss 0.6,
    # pi = 0.8: power = P(b <= 1) + P(b >= 9) for b ~ Bin(10, 0.8).
    pi = 0.8
    hand = sum(math.comb(10, k) * pi**k * (1 - pi) ** (10 - k) for k in (0, 1, 9, 10))
    assert acc.paired_power(10, 0.6, 1.0) == pytest.approx(hand)


def test_smallest_detectable_loss_has_the_target_power():
    mde = acc.smallest_detectable_loss(500, 0.05)
    assert mde is not None and 0 < mde < 0.05
    assert acc.paired_power(500, mde, 0.05) >= 0.8
    assert acc.paired_power(500, mde * 0.95, 0.05) < 0.8


def test_smallest_detectable_loss_none_when_too_few_discordant():
    # 20 questions with 5% discordance: about one discordant question, never significant
    assert acc.smallest_detectable_loss(20, 0.05) is None


def test_required_questions_matches_connor_and_power():
    n = acc.required_questions(0.012, 0.05)
    assert acc.paired_power(n, 0.012, 0.05) >= 0.8
    assert acc.paired_power(n - 50, 0.012, 0.05) < 0.8
    assert abs(n - acc.connor_sample_size(0.012, 0.05)) / n < 0.1


def test_independent_sample_size_matches_note():
    # lm-eval-facts note: 91.8% vs 90.6% needs about 8,700 per arm as independent samples
    assert 8_600 <= acc.independent_sample_size(0.918, 0.906) <= 8_800


def test_power_rejects_impossible_loss():
    with pytest.raises(StudyError, match="discordance"):
        acc.paired_power(500, 0.1, 0.05)


def test_discrimination_detects_and_refuses():
    strong = _records("1" * 30 + "0" * 10)
    weak = _records("0" * 38 + "11")
    yes = acc.discrimination_check("8-shot", strong, "zero-shot", weak)
    assert yes.discriminates and yes.p_value < 1e-6
    assert "discriminates" in yes.sentence()
    floor = acc.discrimination_check("8-shot", _records("0" * 40), "zero-shot", _records("0" * 40))
    assert not floor.discriminates and floor.p_value == 1.0
    assert "cannot discriminate" in floor.sentence()


def test_verdicts_follow_numbers():
    base = acc.accuracy_row("BF16", 459, 500)
    assert "overlap" in acc.unpaired_verdict(base, acc.accuracy_row("FP8 KV", 454, 500))
    assert "do not overlap" in acc.unpaired_verdict(base, acc.accuracy_row("bad", 372, 500))
    loss = acc.compare_paired("BF16", _records("1" * 30), "FP8", _records("1" * 10 + "0" * 20))
    assert "a loss at the 5% level" in acc.paired_verdict(loss, None)
    same = acc.compare_paired("BF16", _records("10" * 5), "FP8", _records("10" * 5))
    assert "exactly the same" in acc.paired_verdict(same, None)
