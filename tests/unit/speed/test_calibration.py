"""Calibration: the false-claim rate on A/A data with a known noise model, power and detectable change."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kvstudy.errors import StudyError
from kvstudy.speed.calibration import (
    centred,
    claim_by_test,
    false_claim_rate,
    minimum_detectable_change,
    power,
)
from kvstudy.speed.verdict import RunSummary
from kvstudy.stats.binary import clopper_pearson

# Known noise model: each run's level is log-normal around 20 ms (sigma 0.10 between runs), its
# requests log-normal around that level (sigma 0.15 within a run), 16 requests per run.
RUN_SIGMA, REQUEST_SIGMA, REQUESTS = 0.10, 0.15, 16


def aa_runs(n: int, seed: int) -> list[RunSummary]:
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n):
        level = 0.020 * math.exp(rng.normal(0.0, RUN_SIGMA))
        tpots = level * np.exp(rng.normal(0.0, REQUEST_SIGMA, REQUESTS))
        runs.append(RunSummary(name=f"aa{i}", tpots_s=tuple(float(t) for t in tpots)))
    return runs


def margin(trials: int, rate: float = 0.05, z: float = 3.0) -> float:
    """Binomial margin: z standard errors of a ``rate`` measured over ``trials``."""
    return z * math.sqrt(rate * (1 - rate) / trials)


def test_fresh_aa_datasets_claim_at_most_five_percent() -> None:
    # 1,000 independent A/A experiments of 4 vs 4 runs from the noise model. The exact test's true
    # rate here is 2/70 = 2.9 %; the check allows 5 % + 3 binomial SE (0.05 + 0.021 = 7.1 %), so a
    # correct implementation fails it with probability < 0.2 %.
    trials = 1000
    claims = 0
    for k in range(trials):
        runs = aa_runs(8, seed=1000 + k)
        claims += (
            claim_by_test([r.tpots_s for r in runs[:4]], [r.tpots_s for r in runs[4:]], resamples=200, seed=k)
            != "no claim"
        )
    assert claims / trials <= 0.05 + margin(trials)


def test_false_claim_rate_of_split_aa_runs() -> None:
    # 12 A/A runs split 6 vs 6 at random 1,000 times: p < 0.05 in at most 5 % of all 924 splits
    # (exact test), so the sampled rate stays below 5 % + 3 binomial SE.
    rate = false_claim_rate(aa_runs(12, seed=7), splits=1000, resamples=200, seed=1)
    assert rate.trials == 1000 and (rate.n_base, rate.n_cand) == (6, 6)
    assert rate.rate <= 0.05 + margin(1000)
    assert rate.ci_95[0] <= rate.rate <= rate.ci_95[1]


def test_resampled_false_claim_rate_from_aa_noise() -> None:
    rate = power(aa_runs(10, seed=3), change=0.0, n_per_arm=5, simulations=1000, resamples=200, seed=2)
    assert rate.rate <= 0.05 + margin(1000)


def test_small_designs_never_claim() -> None:
    rate = false_claim_rate(aa_runs(4, seed=5), splits=1000, seed=0)  # 2 vs 2: smallest p is 1/3
    assert rate.claims == 0


def test_power_grows_with_the_change_and_is_seeded() -> None:
    runs = aa_runs(10, seed=11)
    small = power(runs, change=0.05, n_per_arm=5, simulations=200, resamples=200, seed=4)
    large = power(runs, change=0.5, n_per_arm=5, simulations=200, resamples=200, seed=4)
    assert large.rate > 0.9 and small.rate < large.rate
    assert power(runs, change=0.5, n_per_arm=5, simulations=200, resamples=200, seed=4) == large
    faster = power(runs, change=-0.4, n_per_arm=5, simulations=200, resamples=200, seed=4)
    assert faster.rate > 0.8
    with pytest.raises(StudyError):
        power(runs, change=-1.0)


def test_minimum_detectable_change() -> None:
    runs = aa_runs(10, seed=11)
    kw: dict[str, Any] = dict(n_per_arm=5, simulations=150, seed=0, max_change=1.0, precision=0.02)
    mdc = minimum_detectable_change(runs, use_interval=False, **kw)
    assert mdc is not None and 0.05 < mdc < 0.6
    assert minimum_detectable_change(runs, use_interval=False, **kw) == mdc  # seeded
    with_interval = minimum_detectable_change(runs, resamples=100, **kw)
    assert with_interval is not None and with_interval >= mdc - 0.02  # the interval only adds a condition
    assert power(runs, change=with_interval, n_per_arm=5, simulations=150, resamples=100, seed=0).rate >= 0.8
    assert minimum_detectable_change(runs, n_per_arm=3) is None  # 3 vs 3 cannot reach p < 0.05


def test_centred_removes_each_arms_level(helpers: Any) -> None:
    base = [helpers.summary("b0", 0.02, seed=0), helpers.summary("b1", 0.02 * 1.1, seed=1)]
    cand = [helpers.summary("c0", 0.04, seed=2), helpers.summary("c1", 0.04 * 1.1, seed=3)]
    pooled = centred([base, cand])
    medians = sorted(r.median_tpot_s for r in pooled)
    assert medians[0] == pytest.approx(medians[1]) and medians[2] == pytest.approx(medians[3])
    assert medians[0] * medians[3] == pytest.approx(1.0)


def test_upper_bound_and_bad_input() -> None:
    assert clopper_pearson(0, 1000, 0.90)[1] == pytest.approx(1 - 0.05 ** (1 / 1000))
    assert clopper_pearson(5, 5, 0.90)[1] == 1.0
    with pytest.raises(StudyError, match="cannot split 1 A/A runs"):
        false_claim_rate(aa_runs(1, seed=0))
    with pytest.raises(StudyError, match="no positive per-request TPOT"):
        false_claim_rate([RunSummary(name="empty", tpots_s=()), *aa_runs(3, seed=0)])
