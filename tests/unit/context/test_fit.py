"""ITL = a + b * L fits on synthetic data: recovery, intervals, ratio, break-even and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kvstudy.bench.grid import Captured
from kvstudy.bench.result import RequestRecord
from kvstudy.context.fit import Runs, cells_from_records, check_cell, compare_arms, fit_all, fit_arm, ols
from kvstudy.errors import StudyError

LENGTHS = (256, 1024, 2048, 3072)


def synthetic(arm: str, a: float, b: float, noise: float, runs: int = 3, n: int = 6, seed: int = 0) -> Runs:
    rng = np.random.default_rng(seed)
    out = {}
    for r in range(runs):
        shift = rng.normal(0, noise / 3)
        out[f"{arm}__s{r}"] = {L: a + b * L + shift + rng.normal(0, noise, n) for L in LENGTHS}
    return out


def test_ols_exact_line() -> None:
    assert ols(np.array([1.0, 2.0, 3.0]), np.array([3.0, 5.0, 7.0])) == pytest.approx((1.0, 2.0))


def test_ols_needs_two_lengths() -> None:
    with pytest.raises(StudyError):
        ols(np.array([5.0, 5.0]), np.array([1.0, 2.0]))


def test_fit_recovers_slope_with_interval() -> None:
    fit = fit_arm("auto", synthetic("auto", 2.0, 1e-3, 0.05), n_boot=400)
    assert fit.slope_ci[0] <= 1e-3 <= fit.slope_ci[1]
    assert fit.resolved
    assert fit.intercept_ms == pytest.approx(2.0, abs=0.2)


def test_flat_noisy_line_is_not_resolved() -> None:
    fit = fit_arm("auto", synthetic("auto", 2.0, 0.0, 0.5, seed=3), n_boot=400)
    assert fit.slope_ci[0] < 0 < fit.slope_ci[1]
    assert not fit.resolved


def test_ratio_and_break_even_inside_range() -> None:
    base = fit_arm("auto", synthetic("auto", 2.0, 1e-3, 0.02, seed=1), n_boot=400)
    cand = fit_arm("fp8", synthetic("fp8", 2.8, 5e-4, 0.02, seed=2), n_boot=400)
    cmp = compare_arms(base, cand)
    assert cmp.slope_ratio == pytest.approx(0.5, abs=0.05)
    assert cmp.break_even_tokens == pytest.approx(1600, rel=0.15)
    assert cmp.break_even_ci[0] <= cmp.break_even_tokens <= cmp.break_even_ci[1]
    assert "break-even at" in cmp.statement


def test_break_even_beyond_range_says_none_within() -> None:
    base = fit_arm("auto", synthetic("auto", 2.0, 1e-3, 0.02, seed=1), n_boot=400)
    cand = fit_arm("fp8", synthetic("fp8", 4.0, 5e-4, 0.02, seed=2), n_boot=400)  # crossing at 4,000 tokens
    cmp = compare_arms(base, cand)
    assert "none within the measured range" in cmp.statement


def test_unresolved_difference_claims_no_break_even() -> None:
    base = fit_arm("auto", synthetic("auto", 2.0, 1e-3, 0.3, seed=1), n_boot=400)
    cand = fit_arm("fp8", synthetic("fp8", 2.0, 1e-3, 0.3, seed=2), n_boot=400)
    cmp = compare_arms(base, cand)
    assert cmp.break_even_tokens is None
    assert "not resolved" in cmp.statement


def _record(status: str = "ok", gaps: list[float] | None = None, out: int = 8) -> Captured:
    gaps = [2.0] * 7 if gaps is None else gaps
    req = {
        "ttft_ms": 10.0,
        "e2el_ms": 10.0 + sum(gaps),
        "tpot_ms": 2.0,
        "itls_ms": gaps,
        "output_len": out,
        "success": True,
    }
    data = {
        "cell_id": "auto__s0__L256",
        "arm": "auto",
        "seed": 0,
        "input_len": 256,
        "output_len": 8,
        "status": status,
        "reason": "server did not start" if status != "ok" else "",
    }
    return Captured("auto__s0__L256", data, tuple(RequestRecord(i, None, **req) for i in range(2)))


def test_check_cell_rules() -> None:
    """The bench layer's measurability rules, on a cell's request rows."""
    assert check_cell(_record()).measurable
    assert not check_cell(_record(status="failed")).measurable
    bursts = check_cell(_record(gaps=[0.0] * 7))
    assert not bursts.measurable and bursts.near_zero_gap_share == 1.0 and "under 0.1 ms" in "; ".join(bursts.reasons)
    short = check_cell(_record(out=5))
    assert not short.measurable and "fewer than the 8 output tokens" in "; ".join(short.reasons)
    one_chunk = check_cell(_record(gaps=[]))  # every token after the first in one chunk
    assert not one_chunk.measurable and "chunks per output token" in "; ".join(one_chunk.reasons)


def test_cells_from_records_and_fit_all_skip_single_length_arms() -> None:
    recs = [_record()]
    cells, checks = cells_from_records(recs)
    assert len(cells) == 1 and checks[0].measurable
    assert fit_all(cells) == {}
