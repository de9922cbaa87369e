"""The verdict: hand-checked permutation p-values, the interval, and each condition of a claim."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kvstudy.bench.measurability import assess_run
from kvstudy.errors import StudyError
from kvstudy.speed.verdict import compare_runs, order_check, summarise_run
from kvstudy.stats.permutation import bootstrap_ratio_interval, minimum_p_value, permutation_test, runs_per_arm_needed


def test_minimum_p_values_of_small_designs() -> None:
    assert minimum_p_value(3, 2) == pytest.approx(0.2)  # 2 / C(5, 2): the published design
    assert minimum_p_value(3, 3) == pytest.approx(0.1)  # 2 / C(6, 3)
    assert minimum_p_value(2, 2) == pytest.approx(1 / 3)
    assert minimum_p_value(4, 4) == pytest.approx(2 / 70)
    assert minimum_p_value(1, 1) == 1.0
    assert runs_per_arm_needed(0.05) == 4


def test_three_vs_three_fully_separated_gives_p_one_tenth() -> None:
    t = permutation_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert t.exact and t.splits == 20
    assert t.p_value == pytest.approx(0.1)
    assert t.statistic == pytest.approx(3.0)
    # reversed arms: same p, opposite sign
    r = permutation_test([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
    assert r.p_value == pytest.approx(0.1) and r.statistic == pytest.approx(-3.0)


def test_hand_counted_partial_overlap() -> None:
    # candidate {3, 5, 6} vs baseline {1, 2, 4}: of the 20 three-subsets of {1..6} only {3,5,6} (14)
    # and {4,5,6} (15) have a sum >= 14, so the upper one-sided p is 2/20 and two-sided p = 0.2
    t = permutation_test([1.0, 2.0, 4.0], [3.0, 5.0, 6.0])
    assert t.p_value == pytest.approx(0.2)


def test_three_vs_two_cannot_go_below_one_fifth() -> None:
    t = permutation_test([1.0, 2.0, 3.0], [10.0, 11.0])
    assert t.p_value == pytest.approx(0.2) and t.min_p_value == pytest.approx(0.2)


def test_identical_arms_give_p_one() -> None:
    assert permutation_test([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]).p_value == 1.0


def test_monte_carlo_agrees_with_exact_and_is_seeded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstudy.stats import permutation

    monkeypatch.setattr(permutation, "MAX_EXACT_SPLITS", 5)
    base, cand = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    mc = permutation_test(base, cand, seed=3)
    assert not mc.exact and mc.splits == permutation.MONTE_CARLO_DRAWS
    assert mc.p_value == pytest.approx(0.1, abs=0.015)  # SE of 2 x a 5 % rate over 20,000 draws is 0.003
    assert permutation_test(base, cand, seed=3).p_value == mc.p_value


def test_permutation_test_refuses_empty_or_infinite() -> None:
    with pytest.raises(StudyError):
        permutation_test([], [1.0])
    with pytest.raises(StudyError, match="finite"):
        permutation_test([-math.inf, 1.0], [1.0, 2.0])  # log of a zero TPOT


def test_interleaving_rule() -> None:
    assert order_check([0, 2, 4], [1, 3, 5]).design != "grouped"
    assert order_check([0, 3], [1, 2]).design != "grouped"  # ABBA
    assert order_check([0, 1, 2], [3, 4, 5]).design == "grouped"  # all baseline first
    assert order_check([3, 4], [0, 1]).design == "grouped"  # all candidate first


def _arms(
    h: Any,
    ratio: float,
    n: int = 4,
    *,
    interleave: bool = True,
    clock_b: float | None = None,
    clock_c: float | None = None,
    spread: float = 0.02,
) -> tuple[list, list]:
    base = [
        h.summary(f"b{i}", 0.020 * (1 + spread * i), start=(2 * i + i % 2 if interleave else i), clock=clock_b, seed=i)
        for i in range(n)
    ]
    cand = [
        h.summary(
            f"c{i}",
            0.020 * ratio * (1 + spread * i),
            start=(2 * i + 1 - i % 2 if interleave else n + i),  # ABBA: AB, BA, AB, BA
            clock=clock_c,
            seed=10 + i,
        )
        for i in range(n)
    ]
    return base, cand


def test_clear_speed_up_is_claimed_faster(helpers: Any) -> None:
    base, cand = _arms(helpers, 0.8)
    v = compare_runs(base, cand)
    assert v.verdict == "faster", v.reasons
    assert v.p_value == pytest.approx(2 / 70)
    assert v.tpot_ratio == pytest.approx(0.8, rel=1e-9)
    assert v.tpot_ratio_ci[0] < 0.8 < v.tpot_ratio_ci[1] < 1.0
    assert v.measurable and v.order_design not in ("grouped", "unknown")
    assert "less time per output token" in v.reasons[0]
    slower = compare_runs(cand, base)
    assert slower.verdict == "slower" and slower.tpot_ratio == pytest.approx(1.25)


def test_arms_not_interleaved_make_no_claim(helpers: Any) -> None:
    base, cand = _arms(helpers, 0.8, interleave=False)
    v = compare_runs(base, cand)
    assert v.verdict == "no claim" and v.order_design == "grouped"
    assert any("drift cannot be told from the effect" in r for r in v.reasons)
    assert v.p_value == pytest.approx(2 / 70)  # the figures are still reported


def test_unknown_start_times_make_no_claim(helpers: Any) -> None:
    base = [helpers.summary(f"b{i}", 0.02 * (1 + 0.01 * i), seed=i) for i in range(4)]
    cand = [helpers.summary(f"c{i}", 0.016 * (1 + 0.01 * i), seed=9 + i) for i in range(4)]
    v = compare_runs(base, cand)
    assert v.verdict == "no claim" and any("start times not known" in r for r in v.reasons)
    # the same runs in balanced AB/BA pairs (b c c b b c c b) are claimed
    base = [helpers.summary(f"b{i}", 0.02 * (1 + 0.01 * i), start=t, seed=i) for i, t in enumerate((0, 3, 4, 7))]
    cand = [helpers.summary(f"c{i}", 0.016 * (1 + 0.01 * i), start=t, seed=9 + i) for i, t in enumerate((1, 2, 5, 6))]
    assert compare_runs(base, cand).verdict == "faster"


def test_design_that_cannot_reach_significance_says_so(helpers: Any) -> None:
    base = [helpers.summary(f"b{i}", 0.02, start=2 * i, seed=i) for i in range(3)]
    cand = [helpers.summary(f"c{i}", 0.01, start=2 * i + 1, seed=5 + i) for i in range(2)]
    v = compare_runs(base, cand)
    assert v.verdict == "no claim"
    assert v.min_p_value == pytest.approx(0.2) and v.p_value == pytest.approx(0.2)
    assert any("cannot reach significance" in r and "0.2" in r for r in v.reasons)


def test_unmeasurable_run_makes_no_claim(helpers: Any) -> None:
    base, cand = _arms(helpers, 0.8)
    cand[1] = helpers.summary("c1", 0.016, start=3, seed=11, measurable=False)
    v = compare_runs(base, cand)
    assert v.verdict == "no claim" and v.measurable is False
    assert any("c1" in r and "not measured" in r for r in v.reasons)


def test_clocks_must_be_comparable(helpers: Any) -> None:
    base, cand = _arms(helpers, 0.8, clock_b=1000.0, clock_c=1100.0)
    v = compare_runs(base, cand)
    assert v.verdict == "no claim" and v.clock_ratio == pytest.approx(1.1)
    assert any("clocks differ by +10.0%" in r for r in v.reasons)
    assert compare_runs(base, cand, clock_tolerance=0.15).verdict == "faster"
    near = compare_runs(*_arms(helpers, 0.8, clock_b=1000.0, clock_c=1030.0))
    assert near.verdict == "faster"


def test_missing_clock_for_one_run_blocks_a_claim(helpers: Any) -> None:
    base, cand = _arms(helpers, 0.8, clock_b=1000.0, clock_c=1000.0)
    cand[0] = helpers.summary("c0", 0.016, start=1, seed=10)
    v = compare_runs(base, cand)
    assert v.verdict == "no claim" and any("no median clock for run(s) c0" in r for r in v.reasons)


def test_cycles_per_token_and_clock_adjusted_ratio_published_example(helpers: Any) -> None:
    # the published 32-user row: BF16 142.7 ms at 450 MHz, FP8 138.0 ms at 480 MHz
    base = [helpers.summary(f"b{i}", 0.1427, spread=0.0, start=2 * i, clock=450.0) for i in range(4)]
    cand = [helpers.summary(f"c{i}", 0.1380, spread=0.0, start=2 * i + 1, clock=480.0) for i in range(4)]
    v = compare_runs(base, cand)
    assert v.cycles_per_token["baseline"] == pytest.approx(0.1427 * 450e6)
    assert v.cycles_per_token["candidate"] == pytest.approx(0.1380 * 480e6)
    assert v.clock_adjusted_ratio == pytest.approx(0.1380 * 480 / (0.1427 * 450))  # about 3 % more cycles
    assert v.clock_adjusted_ratio == pytest.approx(1.0315, abs=5e-4)
    text = next(r for r in v.reasons if "cycles per token" in r)
    assert "had the clocks been equal" not in text and "not the effect" in text  # no causal "equal clock" wording
    assert v.verdict == "no claim"  # 480 vs 450 MHz is a 6.7 % clock difference


def test_bootstrap_interval_is_seeded_and_brackets_the_ratio() -> None:
    rng = np.random.default_rng(0)
    base = [0.02 * np.exp(rng.normal(0, 0.1, 30)) for _ in range(4)]
    cand = [0.03 * np.exp(rng.normal(0, 0.1, 30)) for _ in range(4)]
    a = bootstrap_ratio_interval(base, cand, seed=1, resamples=500)
    assert a == bootstrap_ratio_interval(base, cand, seed=1, resamples=500)
    assert a[0] < 1.5 < a[1]
    with pytest.raises(StudyError):
        bootstrap_ratio_interval([[]], [[0.1]])


def test_verdict_record_is_json_ready(helpers: Any) -> None:
    import json
    from dataclasses import asdict

    v = compare_runs(*_arms(helpers, 0.8))
    d = asdict(v)
    json.dumps(d, allow_nan=False)
    assert set(d) >= {"verdict", "measurable", "tpot_ratio", "tpot_ratio_ci", "p_value", "runs", "reasons"}
    assert d["runs"] == {"baseline": 4, "candidate": 4}


def test_summarise_run_of_a_bursty_run(helpers: Any) -> None:
    run = helpers.steady_run(gap_s=0.0, ttft_s=0.06)
    s = summarise_run(run, assess_run(run, "run"), start_time_s=None, median_clock_mhz=None)
    assert not s.measurable and s.unmeasurable_reasons
    v = compare_runs([s, s], [s, s])
    assert v.verdict == "no claim" and v.tpot_ratio is None
    assert any("no positive median TPOT" in r for r in v.reasons)
