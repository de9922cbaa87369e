"""kvstudy.stats.binary (clustered errors included) against published values, hand computation and reference libraries."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar

from kvstudy.errors import StudyError
from kvstudy.stats import binary as stats


def outcomes(
    both_right: int, baseline_only: int, candidate_only: int, both_wrong: int
) -> tuple[dict[int, bool], dict[int, bool]]:
    cells = (
        [(True, True)] * both_right
        + [(True, False)] * baseline_only
        + [(False, True)] * candidate_only
        + [(False, False)] * both_wrong
    )
    return ({i: a for i, (a, _) in enumerate(cells)}, {i: b for i, (_, b) in enumerate(cells)})


def _records(pattern: str) -> dict[int, bool]:
    return {i: ch == "1" for i, ch in enumerate(pattern)}


def test_results_are_frozen_records() -> None:
    cmp = stats.compare(*outcomes(450, 4, 3, 43), margin_points=2.0)
    for record in (cmp, cmp.counts, cmp.interval, cmp.non_inferiority, stats.wilson_interval(3, 4)):
        assert dataclasses.is_dataclass(record)
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.alpha = 0.1  # type: ignore[misc, union-attr]


# --------------------------------------------------------------------------- Wilson


@pytest.mark.parametrize(
    "correct, low, high",
    [
        (459, 89.1, 93.9),  # seed 000, vLLM BF16
        (453, 87.7, 92.9),  # seed 000, FP8 weights and FP8 weights + FP8 KV
        (454, 87.9, 93.0),  # seed 000, FP8 KV cache
    ],
)
def test_wilson_matches_published_intervals(correct: int, low: float, high: float) -> None:
    w = stats.wilson_interval(correct, 500)
    assert (round(100 * w.low, 1), round(100 * w.high, 1)) == (low, high)
    assert w.accuracy == correct / 500 and w.n == 500


def test_wilson_hand_formula() -> None:
    # Wilson score interval written out: (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    k, n, z = 7, 20, 1.959963984540054
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    w = stats.wilson_interval(k, n)
    assert w.low == pytest.approx((centre - half) / (1 + z * z / n), abs=1e-12)
    assert w.high == pytest.approx((centre + half) / (1 + z * z / n), abs=1e-12)


# --------------------------------------------------------------------------- paired table and McNemar


def test_paired_table_layout_and_hand_mcnemar() -> None:
    counts = stats.paired_counts(_records("111110000011"), _records("110001100010"))
    # both right: 0,1,10 -> 3; only base: 2,3,4,11 -> 4; only other: 5,6 -> 2; both wrong: 7,8,9 -> 3
    assert (counts.both_right, counts.baseline_only, counts.candidate_only, counts.both_wrong) == (3, 4, 2, 3)
    assert counts.baseline_correct == 7 and counts.candidate_correct == 5 and counts.n == 12
    assert counts.difference == pytest.approx(-2 / 12) and counts.discordant == 6
    # hand: two-sided exact = 2 * P(Bin(6, 1/2) <= 2) = 2 * (1 + 6 + 15) / 64 = 44/64
    assert stats.mcnemar_exact(counts.baseline_only, counts.candidate_only) == pytest.approx(44 / 64)


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (5, 0, 0.0625),
        (6, 0, 0.03125),
        (0, 5, 0.0625),
        (4, 4, 1.0),
        (3, 3, 1.0),  # symmetric: capped at 1
        (0, 0, 1.0),  # no discordant item
        (1, 9, 2 * (1 + 10) / 1024),  # 2 * P(X <= 1), X ~ Bin(10, 1/2)
        (10, 2, 2 * (1 + 12 + 66) / 4096),  # 2 * P(Bin(12, 1/2) <= 2), counted by hand
    ],
)
def test_mcnemar_exact_known_values(b: int, c: int, expected: float) -> None:
    assert stats.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_is_the_reference_libraries_test() -> None:
    """statsmodels' exact McNemar and scipy's two-sided binomial test give the same p."""
    for b, c in itertools.product(range(0, 25, 3), range(0, 25, 4)):
        ours = stats.mcnemar_exact(b, c)
        assert ours == pytest.approx(float(mcnemar(np.array([[7, b], [c, 9]]), exact=True).pvalue), abs=1e-12)
        if b + c:
            assert ours == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue, abs=1e-12)
    b, c = np.array([0, 5, 10, 4]), np.array([0, 0, 2, 4])
    assert stats.mcnemar_p_values(b, c).tolist() == [stats.mcnemar_exact(x, y) for x, y in zip(b, c)]


def test_paired_counts_refuse_different_items() -> None:
    with pytest.raises(StudyError, match="same questions"):
        stats.paired_counts({0: True, 1: False}, {0: True, 2: False})
    with pytest.raises(StudyError, match="no questions"):
        stats.paired_counts({}, {})


# --------------------------------------------------------------------------- Newcombe paired


def test_newcombe_paired_interval_reproduces_the_published_example() -> None:
    # Cavo et al. (2012), complete response before/after consolidation, the worked example of
    # Newcombe's square-and-add paired interval in Fagerland, Lydersen & Laake, "Statistical
    # Analysis of Contingency Tables" (2017), ch. 8: table [[59, 6], [16, 80]], estimate -0.0621,
    # 95 % CI -0.1186 to -0.0046 (rows: the first measurement = our candidate).
    counts = stats.PairedCounts(both_right=59, baseline_only=16, candidate_only=6, both_wrong=80)
    iv = stats.newcombe_paired_interval(counts)
    assert counts.difference == pytest.approx(-0.0621, abs=5e-5)
    assert iv.difference == pytest.approx(counts.difference)
    assert iv.low == pytest.approx(-0.1186, abs=5e-5)
    assert iv.high == pytest.approx(-0.0046, abs=5e-5)
    assert iv.method == "Newcombe, paired" and iv.alpha == 0.05


def test_newcombe_paired_interval_is_antisymmetric_and_holds_the_estimate() -> None:
    for a, b, c, d in [(40, 5, 2, 3), (459 - 10, 10, 5, 36), (0, 3, 0, 0), (10, 0, 0, 10)]:
        counts = stats.PairedCounts(a, b, c, d)
        iv = stats.newcombe_paired_interval(counts)
        swapped = stats.newcombe_paired_interval(stats.PairedCounts(a, c, b, d))
        assert (iv.low, iv.high) == pytest.approx((-swapped.high, -swapped.low), abs=1e-12)
        assert -1 <= iv.low <= counts.difference <= iv.high <= 1


def test_no_discordant_items_gives_an_interval_around_zero() -> None:
    iv = stats.newcombe_paired_interval(stats.PairedCounts(450, 0, 0, 50))
    assert iv.low < 0 < iv.high


# --------------------------------------------------------------------------- non-inferiority


def test_resolve_margin_points_share_and_default() -> None:
    assert stats.resolve_margin(0.918, margin_points=1.0) == pytest.approx(0.01)
    assert stats.resolve_margin(0.918, margin_share=0.99) == pytest.approx(0.00918)
    assert stats.resolve_margin(0.918) == pytest.approx(0.00918)  # MLPerf's 99 % by default
    with pytest.raises(StudyError, match="not both"):
        stats.resolve_margin(0.9, margin_points=1, margin_share=0.99)
    for bad in ({"margin_points": -1}, {"margin_points": 0}, {"margin_share": 1.5}, {"margin_points": math.nan}):
        with pytest.raises(StudyError, match="margin"):
            stats.resolve_margin(0.9, **bad)  # type: ignore[arg-type]


def test_non_inferiority_judges_the_lower_limit() -> None:
    assert stats.non_inferiority(-0.019, 0.02).non_inferior is True
    assert stats.non_inferiority(-0.02, 0.02).non_inferior is False  # on the margin: not above it
    ni = stats.non_inferiority(-0.001, 0.0071, share=0.99)
    assert ni.non_inferior and ni.margin_points == pytest.approx(0.71) and ni.share_pct == pytest.approx(99)
    assert stats.non_inferiority(-0.001, 0.0).non_inferior is None  # a margin of 0: not judged
    assert stats.non_inferiority(None, 0.05).non_inferior is None  # no interval: not judged


def test_compare_non_inferior_when_the_interval_stays_above_the_margin() -> None:
    v = stats.compare(*outcomes(450, 4, 3, 43), margin_points=2.0)
    assert v.counts == stats.PairedCounts(450, 4, 3, 43)
    assert v.mcnemar_p == pytest.approx(1.0)
    assert v.interval.low > -0.02 and v.non_inferiority.non_inferior
    assert v.non_inferiority.margin == pytest.approx(0.02) and v.difference == pytest.approx(-1 / 500)


def test_compare_significant_loss_is_not_non_inferior() -> None:
    v = stats.compare(*outcomes(400, 30, 5, 65), margin_points=1.0, candidate_label="FP8 KV", baseline_label="BF16")
    assert (v.baseline, v.candidate) == ("BF16", "FP8 KV")
    assert v.mcnemar_p == pytest.approx(stats.mcnemar_exact(30, 5))
    assert v.mcnemar_p < 0.05 and not v.non_inferiority.non_inferior


def test_compare_refuses_different_item_sets_and_bad_margins() -> None:
    with pytest.raises(StudyError, match="same questions"):
        stats.compare({1: True, 2: False}, {1: True, 3: False})
    with pytest.raises(StudyError, match="margin"):
        stats.compare({1: True, 2: False}, {1: True, 2: False}, margin_points=0.0)


# --------------------------------------------------------------------------- discrimination and chance


def test_discrimination_detects_and_refuses() -> None:
    yes = stats.discrimination_check("8-shot", _records("1" * 30 + "0" * 10), "zero-shot", _records("0" * 38 + "11"))
    assert yes.discriminates and yes.p_value < 1e-6
    assert (yes.model_correct, yes.weak_correct, yes.n) == (30, 2, 40)
    # 30 only-model items, 2 only-weak: one-sided P(Bin(32, 1/2) >= 30) = (1 + 32 + 496) / 2^32
    assert yes.p_value == pytest.approx(529 / 2**32)
    floor = stats.discrimination_check("8-shot", _records("0" * 40), "zero-shot", _records("0" * 40))
    assert not floor.discriminates and floor.p_value == 1.0


def test_poisson_binomial_tail_is_exact() -> None:
    chances = [0.25, 0.25, 0.1, 0.5, 0.02]
    for right in range(len(chances) + 1):
        brute = sum(
            math.prod(q if hit else 1 - q for q, hit in zip(chances, hits))
            for hits in itertools.product([0, 1], repeat=len(chances))
            if sum(hits) >= right
        )
        outcomes = [True] * right + [False] * (len(chances) - right)
        assert stats.chance_check("x", outcomes, chances).p_value == pytest.approx(brute, abs=1e-12)
    # equal chances: the binomial tail
    tail = stats.chance_check("x", [True] * 22 + [False] * 42, [0.25] * 64).p_value
    assert tail == pytest.approx(float(sps.binom.sf(21, 64, 0.25)), rel=1e-9)


def test_chance_check_counts() -> None:
    chances = [0.5, 0.25, 0.25, 0.1]
    c = stats.chance_check("BF16", [True, True, False, False], chances)
    assert (c.right, c.n, c.chance_min, c.chance_max) == (2, 4, 0.1, 0.5)
    none = math.prod(1 - q for q in chances)
    one = sum(q * math.prod(1 - r for j, r in enumerate(chances) if j != i) for i, q in enumerate(chances))
    assert c.expected == pytest.approx(1.1) and c.p_value == pytest.approx(1 - none - one)  # at least 2 right
    assert not c.better_than_chance
    assert not stats.chance_check("BF16", [], []).better_than_chance


# --------------------------------------------------------------------------- clustered errors


def test_clustered_error_with_singleton_clusters_equals_the_independent_one() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(-1, 2, size=60).astype(float)
    m = stats.clustered_mean(values.tolist(), list(range(60)))
    assert m.se_clustered == pytest.approx(m.se_independent, rel=1e-12)
    assert m.se_independent == pytest.approx(values.std(ddof=1) / math.sqrt(60))
    assert m.design_effect == pytest.approx(1.0) and m.varies


def test_clustered_error_matches_statsmodels_cluster_robust_ols() -> None:
    import statsmodels.api as sm

    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(12), 5)
    shared = rng.normal(size=12)[groups]
    values = (shared + rng.normal(size=60) > 0).astype(float)
    fit = sm.OLS(values, np.ones(60)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    m = stats.clustered_mean(values.tolist(), groups.tolist())
    assert m.mean == pytest.approx(float(fit.params[0]))
    assert m.se_clustered == pytest.approx(float(fit.bse[0]), rel=1e-10)
    assert m.clusters == 12 and m.design_effect > 1
    t = sps.t.ppf(0.975, 11)
    assert (m.ci_low, m.ci_high) == pytest.approx((m.mean - t * m.se_clustered, m.mean + t * m.se_clustered))


def test_clustered_error_is_exactly_zero_when_clusters_agree() -> None:
    # two contexts, one of four right in each: the per-cluster sums of residuals are exactly 0
    m = stats.clustered_mean([1.0, 0, 0, 0, 0, 1.0, 0, 0], ["a"] * 4 + ["b"] * 4)
    assert m.se_clustered == 0.0 and not m.varies and m.se_independent > 0 and m.design_effect == 0.0
    alike = stats.clustered_mean([0.0] * 6, [0, 0, 0, 1, 1, 1])
    assert alike.se_independent == alike.se_clustered == 0.0 and alike.design_effect == 1.0


def test_clustered_difference_of_needles_in_shared_haystacks() -> None:
    # 4 haystacks x 5 needles; FP8 loses whole haystacks at once (correlated within a context)
    ids = range(20)
    cluster_of = {i: f"haystack-{i // 5}" for i in ids}
    base = {i: True for i in ids}
    cand = {i: i // 5 not in (1, 3) for i in ids}
    m = stats.clustered_difference(base, cand, cluster_of)
    assert m.mean == pytest.approx(-0.5)
    assert m.clusters == 4
    assert m.se_clustered > m.se_independent
    with pytest.raises(StudyError, match="no cluster id"):
        stats.clustered_difference(base, cand, {i: 0 for i in range(19)})
    with pytest.raises(StudyError, match="one cluster"):
        stats.clustered_difference(base, cand, {i: "same" for i in ids})
    with pytest.raises(StudyError, match="one cluster id per item"):
        stats.clustered_mean([1.0, 0.0], ["a"])


def test_exact_mcnemar_of_ten_one_sided_discordant_items() -> None:
    assert stats.mcnemar_exact(10, 0) == pytest.approx(2 * 0.5**10)
    assert stats.mcnemar_exact(0, 0) == 1.0
