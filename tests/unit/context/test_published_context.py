"""The published seed-003 figures and what they imply."""

from __future__ import annotations

import pytest

from kvstudy.context.predict import (
    derive_all,
    load_published,
    slope_figures,
)


def test_file_is_labelled_published_and_names_the_text() -> None:
    data = load_published()
    assert data["source"] == "published"
    assert "vLLM FP8 KV-Cache and Attention Quantization Update" in data["source_text"]


def test_figures_as_printed() -> None:
    figs = {f.id: f for f in slope_figures()}
    h100 = figs["llama-3.1-8b-h100"]
    assert (h100.slope_baseline_ms_per_token, h100.slope_candidate_ms_per_token) == (4.37e-05, 2.37e-05)
    assert h100.break_even_tokens == 7000 and h100.slope_ratio_printed_pct == 54
    assert figs["llama-3.1-8b-b200"].slope_ratio_printed_pct == 54
    assert figs["llama-3.1-8b-b200"].break_even_tokens == 4000
    assert figs["gpt-oss-20b-skip-sw"].slope_ratio_printed_pct == 71


def test_h100_ratio_is_a_46_percent_reduction_and_the_fixed_cost() -> None:
    der = {d.id: d for d in derive_all()}["llama-3.1-8b-h100"]
    assert der.slope_ratio == pytest.approx(2.37 / 4.37)  # 0.542
    assert round(der.slope_ratio_pct) == 54 and round(der.slope_reduction_pct) == 46
    assert "46 % reduction" in der.statement and "54% reduction" in der.statement
    # (4.37e-05 - 2.37e-05) ms/token x 7,000 tokens = 0.14 ms per step
    assert der.slope_difference_ms_per_token == pytest.approx(2.0e-05)
    assert der.fixed_cost_ms == pytest.approx(0.14)
    assert "(20 ns/token x 7,000)" in der.statement  # not "2.00e-05 ms/token" (kvstudy.formats)
    assert der.fixed_cost_bf16_slope_tokens == pytest.approx((1 - 2.37 / 4.37) * 7000)


def test_ratio_only_figures_give_the_cost_in_tokens_of_slope() -> None:
    der = {d.id: d for d in derive_all()}
    b200 = der["llama-3.1-8b-b200"]
    assert b200.ratio_source == "printed ratio" and b200.fixed_cost_ms is None
    assert b200.fixed_cost_bf16_slope_tokens == pytest.approx(0.46 * 4000)  # 1,840 tokens
    oss = der["gpt-oss-20b-skip-sw"]
    assert oss.slope_reduction_pct == pytest.approx(29) and oss.fixed_cost_bf16_slope_tokens is None
