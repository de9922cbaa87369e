"""Paired verdicts: exact McNemar, Newcombe's paired interval, non-inferiority, totals, clusters."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from kvstudy.accuracy import paired
from kvstudy.accuracy import stats as acc
from kvstudy.errors import StudyError


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


# --------------------------------------------------------------------------- exact McNemar


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (5, 0, 0.0625),
        (6, 0, 0.03125),
        (0, 5, 0.0625),
        (4, 4, 1.0),
        (0, 0, 1.0),
        (10, 2, 2 * (1 + 12 + 66) / 4096),  # 2 * P(Bin(12, 1/2) <= 2), counted by hand
    ],
)
def test_mcnemar_exact_known_values(b: int, c: int, expected: float) -> None:
    assert paired.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_matches_statsmodels_and_scipy_binomtest() -> None:
    for b, c in itertools.product(range(0, 25, 3), range(0, 25, 4)):
        ours = paired.mcnemar_exact(b, c)
        assert ours == pytest.approx(acc.mcnemar_exact_p([[7, b], [c, 9]]), abs=1e-12)
        if b + c:
            assert ours == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue, abs=1e-12)


@pytest.mark.parametrize("bad", [-1, 2.0, True, "3"])
def test_mcnemar_exact_refuses_non_counts(bad: object) -> None:
    with pytest.raises(StudyError, match="baseline_only"):
        paired.mcnemar_exact(bad, 1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Newcombe paired


def test_newcombe_paired_interval_reproduces_the_published_example() -> None:
    # Cavo et al. (2012), complete response before/after consolidation, the worked example of
    # Newcombe's square-and-add paired interval in Fagerland, Lydersen & Laake, "Statistical
    # Analysis of Contingency Tables" (2017), ch. 8: table [[59, 6], [16, 80]], estimate -0.0621,
    # 95 % CI -0.1186 to -0.0046 (rows: the first measurement = our candidate).
    counts = paired.PairedCounts(both_right=59, baseline_only=16, candidate_only=6, both_wrong=80)
    low, high = paired.paired_difference_ci(counts)
    assert counts.difference == pytest.approx(-0.0621, abs=5e-5)
    assert low == pytest.approx(-0.1186, abs=5e-5)
    assert high == pytest.approx(-0.0046, abs=5e-5)


def test_newcombe_paired_interval_is_antisymmetric_and_holds_the_estimate() -> None:
    for a, b, c, d in [(40, 5, 2, 3), (459 - 10, 10, 5, 36), (0, 3, 0, 0), (10, 0, 0, 10)]:
        counts = paired.PairedCounts(a, b, c, d)
        swapped = paired.PairedCounts(a, c, b, d)
        low, high = paired.paired_difference_ci(counts)
        s_low, s_high = paired.paired_difference_ci(swapped)
        assert (low, high) == pytest.approx((-s_high, -s_low), abs=1e-12)
        assert -1 <= low <= counts.difference <= high <= 1


def test_no_discordant_items_gives_an_interval_around_zero() -> None:
    low, high = paired.paired_difference_ci(paired.PairedCounts(450, 0, 0, 50))
    assert low < 0 < high


def test_paired_interval_narrower_than_unpaired_when_runs_agree() -> None:
    counts = paired.PairedCounts(450, 9, 4, 37)
    low, high = paired.paired_difference_ci(counts)
    u_low, u_high = paired.unpaired_difference_ci(counts.n, counts.baseline_correct, counts.candidate_correct)
    assert high - low < u_high - u_low


# --------------------------------------------------------------------------- verdicts


def test_resolve_margin_points_share_and_default() -> None:
    assert paired.resolve_margin(0.918, margin_points=1.0) == pytest.approx(0.01)
    assert paired.resolve_margin(0.918, margin_share=0.99) == pytest.approx(0.00918)
    assert paired.resolve_margin(0.918) == pytest.approx(0.00918)  # MLPerf's 99 % by default
    with pytest.raises(StudyError, match="not both"):
        paired.resolve_margin(0.9, margin_points=1, margin_share=0.99)
    for bad in ({"margin_points": -1}, {"margin_points": 0}, {"margin_share": 1.5}, {"margin_points": math.nan}):
        with pytest.raises(StudyError, match="margin"):
            paired.resolve_margin(0.9, **bad)


def test_compare_non_inferior_when_the_interval_stays_above_the_margin() -> None:
    base, cand = outcomes(450, 4, 3, 43)
    v = paired.compare(base, cand, margin_points=2.0)
    assert v.counts == paired.PairedCounts(450, 4, 3, 43)
    assert v.mcnemar_p == pytest.approx(1.0)
    assert v.ci_low > -0.02 and v.non_inferior
    assert "Non-inferior at a margin of 2.00 points" in v.text
    assert "no difference" in v.text and "not proof" in v.text


def test_compare_significant_loss_is_not_non_inferior() -> None:
    base, cand = outcomes(400, 30, 5, 65)
    v = paired.compare(base, cand, margin_points=1.0, candidate_label="FP8 KV", baseline_label="BF16")
    assert v.mcnemar_p == pytest.approx(paired.mcnemar_exact(30, 5))
    assert v.mcnemar_p < 0.05 and not v.non_inferior
    assert "FP8 KV scoring lower than BF16" in v.text
    assert "is not shown" in v.text


def test_verdict_text_never_uses_wilson_overlap_as_a_test() -> None:
    for cells in [(450, 4, 3, 43), (400, 30, 5, 65), (450, 0, 0, 50), (300, 2, 20, 178)]:
        text = paired.compare(*outcomes(*cells), margin_points=1.0).text.lower()
        assert "overlap" not in text and "wilson" not in text


def test_verdict_json_keys_and_units() -> None:
    v = paired.compare(*outcomes(450, 9, 4, 37), margin_points=1.0)
    data = v.to_json()
    assert {"n", "correct", "discordant", "mcnemar_p", "difference_ci", "non_inferior", "verdict"} <= set(data)
    assert data["correct"] == {"baseline": 459, "candidate": 454}
    assert data["discordant"] == {"baseline_only": 9, "candidate_only": 4}
    assert data["difference_ci"] == pytest.approx([100 * v.ci_low, 100 * v.ci_high])


def test_compare_refuses_different_item_sets() -> None:
    with pytest.raises(StudyError, match="same questions"):
        paired.compare({1: True, 2: False}, {1: True, 3: False})


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
    kv = paired.totals_bounds(500, 459, 454)  # FP8 KV cache, published
    weights = paired.totals_bounds(500, 459, 453)  # FP8 weights, published
    assert kv.mcnemar_p_min == pytest.approx(0.0625, rel=1e-12)
    assert weights.mcnemar_p_min == pytest.approx(0.03125, rel=1e-12)
    assert (kv.discordant_min, kv.discordant_max) == (5, 87)
    assert (weights.discordant_min, weights.discordant_max) == (6, 88)  # 1.2 % to 17.6 %
    assert kv.mcnemar_p_max == pytest.approx(paired.mcnemar_exact(46, 41))
    assert "cannot show a difference" in kv.text
    assert "between 0.0312 and" in weights.text


def test_totals_detectable_loss_over_the_disagreement_range() -> None:
    t = paired.totals_bounds(500, 459, 453)
    # the high end: 5.4 points at 17.6 % disagreement, as the issue says
    assert round(100 * t.detectable_loss_high, 1) == 5.4
    assert t.detectable_loss_high == pytest.approx(acc.smallest_detectable_loss(500, 0.176))
    # the low end: below ~1.6 % disagreement no loss at all is found with 80 % power at n = 500
    # (even with every disagreement one way); there the detectable loss is ~1.6 points. The
    # issue's 1.8 is the value at 2 % disagreement.
    assert t.power_floor == pytest.approx(0.0158, abs=5e-4)
    assert acc.paired_power(500, t.power_floor, t.power_floor) >= 0.8
    assert acc.paired_power(500, t.power_floor - 1e-3, t.power_floor - 1e-3) < 0.8
    assert round(100 * t.detectable_loss_low, 1) == 1.6
    assert round(100 * acc.smallest_detectable_loss(500, 0.02), 1) == 1.8


def test_detectable_loss_rises_with_disagreement() -> None:
    rates = [0.02, 0.04, 0.08, 0.12, 0.176]
    losses = [acc.smallest_detectable_loss(500, r) for r in rates]
    assert all(x is not None for x in losses)
    assert losses == sorted(losses)


@pytest.mark.parametrize("n, a, b", [(12, 7, 5), (10, 10, 3), (9, 0, 0), (15, 8, 8), (7, 2, 6)])
def test_totals_match_brute_force_enumeration(n: int, a: int, b: int) -> None:
    tables = brute_force_pairings(n, a, b)
    ps = [paired.mcnemar_exact(x, y) for x, y in tables]
    t = paired.totals_bounds(n, a, b)
    assert t.mcnemar_p_min == pytest.approx(min(ps))
    assert t.mcnemar_p_max == pytest.approx(max(ps))
    assert t.discordant_min == min(x + y for x, y in tables)
    assert t.discordant_max == max(x + y for x, y in tables)
    only_a, only_b = paired.possible_pairings(n, a, b)
    assert sorted(zip(only_a.tolist(), only_b.tolist())) == sorted(tables)


def test_totals_unpaired_interval_is_statsmodels_newcombe() -> None:
    from statsmodels.stats.proportion import confint_proportions_2indep

    t = paired.totals_bounds(500, 459, 454)
    low, high = confint_proportions_2indep(454, 500, 459, 500, method="newcomb")
    assert (t.unpaired_ci_low, t.unpaired_ci_high) == pytest.approx((low, high))
    assert t.unpaired_ci_low < -0.01 < t.unpaired_ci_high


def test_totals_small_n_has_no_detectable_loss() -> None:
    t = paired.totals_bounds(5, 3, 2)
    assert t.detectable_loss_low is None and t.detectable_loss_high is None
    assert "at none of these rates" in t.text


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
        paired.totals_bounds(n, a, b)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- clustered errors


def test_clustered_error_with_singleton_clusters_equals_the_independent_one() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(-1, 2, size=60).astype(float)
    m = paired.clustered_mean(values, list(range(60)))
    assert m.se_clustered == pytest.approx(m.se_independent, rel=1e-12)
    assert m.se_independent == pytest.approx(values.std(ddof=1) / math.sqrt(60))
    assert m.design_effect == pytest.approx(1.0)


def test_clustered_error_matches_statsmodels_cluster_robust_ols() -> None:
    import statsmodels.api as sm

    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(12), 5)
    shared = rng.normal(size=12)[groups]
    values = (shared + rng.normal(size=60) > 0).astype(float)
    fit = sm.OLS(values, np.ones(60)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    m = paired.clustered_mean(values, groups.tolist())
    assert m.mean == pytest.approx(float(fit.params[0]))
    assert m.se_clustered == pytest.approx(float(fit.bse[0]), rel=1e-10)
    assert m.clusters == 12 and m.design_effect > 1
    t = sps.t.ppf(0.975, 11)
    assert (m.ci_low, m.ci_high) == pytest.approx((m.mean - t * m.se_clustered, m.mean + t * m.se_clustered))


def test_clustered_difference_of_needles_in_shared_haystacks() -> None:
    # 4 haystacks x 5 needles; FP8 loses whole haystacks at once (correlated within a context)
    ids = range(20)
    cluster_of = {i: f"haystack-{i // 5}" for i in ids}
    base = {i: True for i in ids}
    cand = {i: i // 5 not in (1, 3) for i in ids}
    m = paired.clustered_difference(base, cand, cluster_of)
    assert m.mean == pytest.approx(-0.5)
    assert m.clusters == 4
    assert m.se_clustered > m.se_independent
    with pytest.raises(StudyError, match="no cluster id"):
        paired.clustered_difference(base, cand, {i: 0 for i in range(19)})
    with pytest.raises(StudyError, match="one cluster"):
        paired.clustered_difference(base, cand, {i: "same" for i in ids})
    with pytest.raises(StudyError, match="one cluster id per item"):
        paired.clustered_mean([1.0, 0.0], ["a"])
