"""KL from truncated top-k lists, the equivalence verdict on synthetic pairs, the margin calibration."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvstudy.errors import StudyError
from kvstudy.precision import analysis

P = [0.5, 0.3, 0.1, 0.05, 0.05]
Q = [0.4, 0.35, 0.1, 0.1, 0.05]


def full_kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


def top(dist: list[float], k: int, also: int | None = None) -> dict[int, float]:
    ids = sorted(range(len(dist)), key=lambda i: -dist[i])[:k] + ([also] if also is not None else [])
    return {i: math.log(dist[i]) for i in ids}


def test_lumped_kl_is_exact_on_the_lumped_distributions_and_bounds_the_full_kl() -> None:
    got = analysis.token_kl(top(P, 2), top(Q, 2))
    lumped = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.35) + 0.2 * math.log(0.2 / 0.25)
    assert got.kl == pytest.approx(lumped, abs=1e-12)
    assert got.rest == pytest.approx(0.2)
    assert got.kl <= full_kl(P, Q) <= got.kl + got.gap  # the tail diverges no more than the head here


def test_with_every_token_listed_the_kl_is_the_full_kl_and_the_gap_zero() -> None:
    got = analysis.token_kl(top(P, 5), top(Q, 5))
    assert got.kl == pytest.approx(full_kl(P, Q), abs=1e-12) and got.gap == pytest.approx(0.0, abs=1e-12)


def test_tokens_listed_by_one_arm_only_go_to_the_rest() -> None:
    # P's top-2 is {0, 1}; Q's is {1, 3}: only token 1 is compared, everything else is "rest"
    q = [0.1, 0.4, 0.05, 0.4, 0.05]
    got = analysis.token_kl(top(P, 2), top(q, 2))
    lumped = 0.3 * math.log(0.3 / 0.4) + 0.7 * math.log(0.7 / 0.6)
    assert got.kl == pytest.approx(lumped, abs=1e-12)
    assert got.kl <= full_kl(P, q)


def test_the_gap_rests_on_the_tail_assumption() -> None:
    # a tail that diverges far more than the head: the lumped KL is still a lower bound, the
    # assumed upper value is not (what the reports say in words)
    p = [0.5, 0.3, 0.19, 0.01]
    q = [0.5, 0.3, 0.01, 0.19]
    got = analysis.token_kl(top(p, 2), top(q, 2))
    assert got.kl == pytest.approx(0.0, abs=1e-12) and full_kl(p, q) > got.kl + got.gap


def test_listed_mass_over_one_and_a_vanishing_rest() -> None:
    over = {0: math.log(0.7), 1: math.log(0.3000001)}
    got = analysis.token_kl(over, {0: math.log(0.6), 1: math.log(0.4)})
    assert got.rest == 0.0 and got.kl == pytest.approx(0.7 * math.log(0.7 / 0.6) + 0.3 * math.log(0.3 / 0.4), abs=1e-6)
    nothing_left = analysis.token_kl({0: math.log(0.5)}, {0: 0.0})  # Q lists all its mass on token 0
    assert math.isfinite(nothing_left.kl) and nothing_left.kl > 0


@pytest.mark.parametrize("bad", [{0: float("nan")}, {0: 0.5}, {}])
def test_bad_top_k_is_one_line(bad: dict[int, float]) -> None:
    with pytest.raises(StudyError):
        analysis.token_kl(bad, {0: -0.1})


# --------------------------------------------------------------------------- equivalence on synthetic pairs


def rows(shift: float, noise: float, clusters: int = 40, tokens: int = 10, seed: int = 1) -> tuple[list, list]:
    """Baseline and candidate rows whose per-token Δ log p is ``shift`` plus cluster and token noise."""
    rng = np.random.default_rng(seed)
    base, cand = [], []
    for c in range(clusters):
        logp = list(rng.uniform(-3, -0.1, tokens))
        offset = rng.normal(0, noise)
        delta = shift + offset + rng.normal(0, noise, tokens)
        base.append({"id": f"p{c}", "bucket": "b", "cluster": f"c{c}", "logp": logp, "top1": None})
        cand.append(
            {"id": f"p{c}", "bucket": "b", "cluster": f"c{c}", "logp": list(np.array(logp) + delta), "top1": None}
        )
    return base, cand


@pytest.mark.parametrize(
    ("shift", "noise", "expected"),
    [(0.0, 0.002, "within"), (-0.05, 0.002, "beyond"), (-0.009, 0.02, "undecided")],
)
def test_delta_logp_equivalence_on_synthetic_pairs(shift: float, noise: float, expected: str) -> None:
    paired = analysis.pair_rows(*rows(shift, noise))
    assert paired.tost is not None
    assert analysis.equivalence(paired.tost.ci_low, paired.tost.ci_high, 0.01, two_sided=True).state == expected


@pytest.mark.parametrize(("level", "expected"), [(0.001, "within"), (0.05, "beyond"), (0.01, "undecided")])
def test_kl_equivalence_on_synthetic_pairs(level: float, expected: str) -> None:
    """Per-token KLs of mean ``level`` built from two-token top-k lists (P = (1/2, 1/2), Q = (q, 1 - q),
    so KL = -log(4 q (1 - q)) / 2 and nothing lies outside the lists), paired through ``pair_rows``."""
    rng = np.random.default_rng(3)
    values = rng.gamma(4.0, 1.0, 400)
    values = values * level / values.mean()  # mean exactly ``level``
    qs = (1 - np.sqrt(1 - np.exp(-2 * values))) / 2
    half = [[0, math.log(0.5)], [1, math.log(0.5)]]
    base, cand = [], []
    for c in range(40):
        row = {"id": f"p{c}", "bucket": "b", "cluster": f"c{c}", "logp": [-1.0] * 10}
        base.append({**row, "topk": [half] * 10})
        cand.append({**row, "topk": [[[0, math.log(q)], [1, math.log1p(-q)]] for q in qs[10 * c : 10 * c + 10]]})
    paired = analysis.pair_rows(base, cand)
    assert paired.kl is not None and paired.kl.mean == pytest.approx(level) and paired.kl.gap == 0.0
    assert analysis.equivalence(paired.kl.low, paired.kl.high, 0.01).state == expected


def test_equivalence_without_a_margin_or_interval_is_undecided() -> None:
    assert analysis.equivalence(0.0, 0.001, None).state == "undecided"
    assert analysis.equivalence(float("nan"), float("nan"), 0.01).state == "undecided"


# --------------------------------------------------------------------------- calibration on a synthetic ladder


def ladder(changes: list[float], kls: list[float] | None = None, bf16: float = 0.0) -> list[analysis.Grade]:
    factors = [1, 8, 32, 128, 512, 2048]
    kls = kls or [0.0005 * 4**i for i in range(len(changes))]
    return [
        analysis.Grade(f, c, c - 1.5, c + 1.5, k, -k / 2, bf16 if f == 1 else 0.0)
        for f, c, k in zip(factors, changes, kls)
    ]


def test_the_margin_is_read_at_the_first_grade_shown_to_lose_two_points() -> None:
    cal = analysis.calibrate(ladder([0.0, -0.2, -0.8, -2.4, -9.0, -40.0]))  # -2.4 ± 1.5 does not show it; -9.0 does
    assert cal.state == "calibrated" and cal.grade == 512 and cal.below == 128
    assert cal.margin_kl == pytest.approx(0.0005 * 4**4) and cal.margin_delta_logp == pytest.approx(0.0005 * 4**4 / 2)
    assert (cal.change_low, cal.change_high) == pytest.approx((-10.5, -7.5))
    assert all(cal.ranked.values())
    noisy = analysis.calibrate(ladder([-3.0, -0.2, -0.8, -2.4, -9.0, -40.0]))  # a first grade at -3 ± 1.5 by chance
    assert noisy.grade == 512


def test_no_grade_reaching_the_loss_is_not_calibrated() -> None:
    cal = analysis.calibrate(ladder([0.0, 0.0, -0.1, -0.3, -0.5, -1.0]))
    assert (
        cal.state == "not calibrated" and cal.margin_kl is None and "no grade is shown to lose 2 points" in cal.reason
    )


def test_an_instrument_out_of_order_is_not_calibrated() -> None:
    cal = analysis.calibrate(ladder([0.0, -0.2, -0.8, -2.4, -9.0, -40.0], kls=[0.001, 0.004, 0.002, 0.1, 0.5, 1.0]))
    assert cal.state == "not calibrated" and not cal.ranked["KL"] and "KL" in cal.reason


def test_a_first_grade_broken_at_16_bit_is_refused() -> None:
    with pytest.raises(StudyError, match="broken, not the FP8 storage"):
        analysis.calibrate(ladder([0.0, -0.2, -0.8, -2.4, -9.0, -40.0], bf16=-5.0))
    with pytest.raises(StudyError, match="at least two"):
        analysis.calibrate(ladder([0.0]))


def test_a_reversal_inside_the_noise_keeps_the_order() -> None:
    """Grades whose K stays inside FP8's range differ by noise: a reversal counts only when the two
    grades' intervals do not overlap."""
    base = ladder([0.0, 1.0, -0.8, -2.4, -9.0, -40.0])  # factor 8 +1.0 above factor 1's 0.0: intervals overlap
    cal = analysis.calibrate(base)
    assert cal.ranked["accuracy"] and cal.state == "calibrated" and cal.grade == 512
    assert cal.below == 128 and cal.below_kl == pytest.approx(0.0005 * 4**3)
    apart = ladder([0.0, 4.0, -0.8, -2.4, -9.0, -40.0])  # +4.0 ± 1.5 against 0.0 ± 1.5: a real reversal
    assert not analysis.calibrate(apart).ranked["accuracy"]
    kl = [
        analysis.Grade(f, c, c - 1, c + 1, k, -k, 0.0, lo, hi)
        for f, c, k, lo, hi in [
            (1, 0.0, 0.0010, 0.0008, 0.0012),
            (8, -0.5, 0.0009, 0.0007, 0.0011),
            (64, -5.0, 0.05, 0.04, 0.06),
        ]
    ]
    assert analysis.calibrate(kl).ranked["KL"]  # 0.9 below 1.0 millinats, inside each other's bounds
    kl[1] = analysis.Grade(8, -0.5, -1.5, 0.5, 0.0002, -0.0002, 0.0, 0.0001, 0.0003)
    assert not analysis.calibrate(kl).ranked["KL"]


def test_any_grade_broken_at_16_bit_is_refused_and_a_16_bit_arm_not_run_is_not() -> None:
    grades = ladder([0.0, -0.2, -0.8, -2.4, -9.0, -40.0])
    top = dataclasses.replace(grades[-1], bf16_change_points=-3.0)
    with pytest.raises(StudyError, match="grade 2048 already loses 3.0 points with 16-bit KV"):
        analysis.calibrate([*grades[:-1], top])
    not_run = [dataclasses.replace(g, bf16_change_points=math.nan) for g in grades]
    assert analysis.calibrate(not_run).state == "calibrated"
