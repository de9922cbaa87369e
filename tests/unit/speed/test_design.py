"""The design rules behind the <= 5 % guarantee, and the corrected claims of notebook 02.

Each test fails on the condition the old wording or rule allowed: the old interleaving check (any
overlap in time), no registered run count, no multiplicity correction, unblocked seeds, a constant
clock read as an equal clock, queueing unflagged, an A/A calibration that could not fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstudy.speed import calibration as cal
from kvstudy.speed.verdict import RunSummary, adjust_for_multiplicity, compare_runs, order_check, registration_check
from kvstudy.stats.binary import clopper_pearson, holm
from kvstudy.stats.permutation import blocked_min_p, blocks_needed, permutation_test

ROOT = Path(__file__).resolve().parents[3]


def _run(name: str, median_s: float, start: float, block: int | None, clock: float | None = None) -> RunSummary:
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    tpots = median_s * np.exp(rng.normal(0.0, 0.02, 16))
    tpots *= median_s / float(np.median(tpots))
    return RunSummary(name, tuple(float(t) for t in tpots), start_time_s=start, median_clock_mhz=clock, block=block)


def _abba(ratio: float, seeds: int, *, clock: float | None = None, spread: float = 0.01) -> tuple[list, list]:
    base, cand = [], []
    for s in range(seeds):
        first, second = (2 * s, 2 * s + 1) if s % 2 == 0 else (2 * s + 1, 2 * s)
        level = 0.02 * (1 + spread * ((s * 7) % 5))
        base.append(_run(f"b{s}", level, first, s, clock))
        cand.append(_run(f"c{s}", level * ratio, second, s, clock))
    return base, cand


# --------------------------------------------------------------------------- run order


def test_nearly_grouped_order_passes_the_old_check_but_is_refused() -> None:
    base, cand = [0, 1, 2, 4], [3, 5, 6, 7]  # A A A B A B B B
    assert order_check(base, cand).design != "grouped"  # the old rule (arms interleaved at all) let this through
    check = order_check(base, cand)
    assert check.accepted is False and check.design == "nearly grouped"
    assert order_check([0, 3, 4, 7], [1, 2, 5, 6]).accepted  # ABBA
    assert not order_check([0, 2, 4, 6], [1, 3, 5, 7]).accepted  # AB AB AB AB: drift never cancels


def test_seed_blocks_must_be_adjacent_and_balanced() -> None:
    assert order_check([0, 3, 4], [1, 2, 5], [0, 1, 2], [0, 1, 2]).accepted
    split = order_check([0, 1, 4], [2, 3, 5], [0, 1, 2], [0, 1, 2])  # seed 0's runs at 0 and 2
    assert split.accepted is False and "not adjacent" in split.reason


def test_drift_makes_nearly_grouped_orders_claim_and_abba_blocks_do_not() -> None:
    """Linear drift, no effect: the nearly grouped order claims far above 5 % under the old check;
    the blocked test on ABBA stays at or below 5 %; the new check refuses the grouped order."""
    rng = np.random.default_rng(7)
    grouped_claims = abba_claims = 0
    trials = 400
    grouped_b, grouped_c = [0, 1, 2, 3, 5, 6], [4, 7, 8, 9, 10, 11]
    for _ in range(trials):
        drift = lambda t: 0.01 * t + rng.normal(0, 0.004)  # noqa: E731
        b = [drift(t) for t in grouped_b]
        c = [drift(t) for t in grouped_c]
        grouped_claims += permutation_test(b, c).p_value < 0.05
        starts_b = [2 * s + (s % 2) for s in range(6)]
        starts_c = [2 * s + 1 - (s % 2) for s in range(6)]
        b = [drift(t) for t in starts_b]
        c = [drift(t) for t in starts_c]
        abba_claims += permutation_test(b, c, base_blocks=range(6), cand_blocks=range(6)).p_value < 0.05
    assert order_check(grouped_b, grouped_c).design != "grouped" and grouped_claims / trials > 0.2
    assert order_check(grouped_b, grouped_c).accepted is False
    assert abba_claims / trials <= 0.05


# --------------------------------------------------------------------------- blocked test, registration, Holm


def test_blocked_test_permutes_within_seeds() -> None:
    assert blocked_min_p([(1, 1)] * 3) == pytest.approx(0.25)
    assert blocked_min_p([(1, 1)] * 6) == pytest.approx(2 / 64)
    assert blocks_needed(0.05) == 6 and blocks_needed(0.05 / 8) == 9
    t = permutation_test([0.0] * 6, [0.1] * 6, base_blocks=range(6), cand_blocks=range(6))
    assert t.blocks == 6 and t.p_value == pytest.approx(2 / 64) and t.exact


def test_seed_blocks_decide_the_reachable_p_of_a_verdict() -> None:
    v = compare_runs(*_abba(0.8, 3))
    assert v.blocks == 3 and v.min_p_value == pytest.approx(0.25) and v.verdict == "no claim"
    assert compare_runs(*_abba(0.8, 6)).verdict == "faster"


def test_fewer_runs_than_registered_is_an_incomplete_design() -> None:
    base, cand = _abba(0.8, 6)
    assert compare_runs(base, cand, registered_runs_per_arm=6).verdict == "faster"
    v = compare_runs(base, cand, registered_runs_per_arm=8)
    assert v.verdict == "no claim" and any(r.startswith("incomplete design, no claim") for r in v.reasons)
    more = compare_runs(base, cand, registered_runs_per_arm=5)
    assert more.verdict == "no claim" and any("more runs than the 5 per arm registered" in r for r in more.reasons)
    assert registration_check(6, 6, None) == ""


def test_holm_over_the_tests_of_one_report() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    claim = compare_runs(*_abba(0.8, 6))  # p = 2/64 alone: a claim
    null = compare_runs(*_abba(1.0, 6))
    out = adjust_for_multiplicity([claim] + [null] * 7)  # the L4 profile's 8 tests
    assert out[0].verdict == "no claim" and out[0].p_adjusted == pytest.approx(8 * 2 / 64)
    assert out[0].family_size == 8 and "Holm" in out[0].multiplicity
    assert any("smallest reachable adjusted p is 0.25" in r for r in out[0].reasons)
    assert adjust_for_multiplicity([claim])[0].verdict == "faster"


def test_queueing_refuses_a_claim() -> None:
    reason = "queueing: TPOT includes waiting (12 of 32 requests wait)"
    v = compare_runs(*_abba(0.8, 6), refusals=[reason])
    assert v.verdict == "no claim" and v.reasons[0] == reason


def test_constant_clock_is_not_varied_not_an_equal_clock() -> None:
    v = compare_runs(*_abba(0.99, 3, clock=2445.4))
    assert v.clock_status == "not varied / not measured" and v.clock_ratio is None and v.cycles_per_token is None
    text = " ".join(v.reasons)
    assert "not varied / not measured" in text and "had the clocks been equal" not in text


# --------------------------------------------------------------------------- calibration


def _aa_blocks(seeds: int, sd: float = 0.05) -> list[RunSummary]:
    rng = np.random.default_rng(3)
    runs = []
    for s in range(seeds):
        for arm in ("a", "r"):
            runs.append(_run(f"{arm}{s}", 0.02 * float(np.exp(rng.normal(0, sd))), 2 * s + (arm == "r"), s))
    return runs


def test_a_calibration_that_cannot_fail_is_not_reported_as_passed() -> None:
    rate = cal.false_claim_rate(_aa_blocks(3))
    assert rate.trials == 0 and rate.min_p == pytest.approx(0.25)
    assert rate.text.startswith("calibration not possible with this design")
    sim = cal.power(_aa_blocks(3), change=0.0, n_per_arm=6, simulations=200)
    assert sim.trials > 0 and sim.blocked and sim.ci_95[0] <= sim.rate <= sim.ci_95[1]
    assert cal.power(_aa_blocks(3), change=0.0, n_per_arm=5, simulations=10).trials == 0


def test_power_comes_with_its_uncertainty() -> None:
    runs = _aa_blocks(3)
    pw = cal.power(runs, change=0.2, n_per_arm=6, simulations=200, resamples=100)
    assert pw.ci_95[0] <= pw.rate <= pw.ci_95[1] and pw.ci_95[1] - pw.ci_95[0] > 0.0
    sens = cal.noise_sensitivity(runs, change=0.2, n_per_arm=6, simulations=1000)
    assert sens is not None and sens.df == 3 and sens.sigma_low < sens.sigma < sens.sigma_high
    assert sens.power_high_noise <= sens.power <= sens.power_low_noise
    assert clopper_pearson(20, 100)[0] < 0.2 < clopper_pearson(20, 100)[1]


# --------------------------------------------------------------------------- the published table


def _published() -> Any:
    from kvstudy.speed import analysis

    return analysis.load_published(ROOT / "data" / "published" / "l4-speed-qwen3-8b.json")


def test_published_throughput_contradicts_the_assumed_request_length() -> None:
    from kvstudy.speed import verdicts_table as vt

    rows = {(r.users, r.configuration): r for r in vt.published_consistency(_published(), 1152)}
    at32 = rows[(32, "bf16")]
    assert at32.implied_streams == pytest.approx(26.64, abs=0.01)
    assert at32.requests_that_fit == 20 and at32.check.startswith("contradiction")
    assert rows[(1, "bf16")].implied_streams == pytest.approx(1.10, abs=0.01)


def test_published_one_user_row_makes_no_bound_claim() -> None:
    from kvstudy.report.tables import PUBLISHED_VERDICTS, render
    from kvstudy.speed import verdicts_table as vt

    table = render(vt.published_verdicts(_published(), 1152), PUBLISHED_VERDICTS)
    for text in table["against the bound"]:
        assert "another factor changed" not in text
        assert text.startswith("no claim: the request length was not published")
        assert "26.6 streams" in text and "20 such requests fit" in text
