"""Per-run measurability: bursts, short outputs, failures, clock windows; vLLM's TPOT definition."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kvstudy.bench.measurability import (
    MAX_NEAR_ZERO_GAP_SHARE,
    NEAR_ZERO_GAP_S,
    assess_run,
    per_request_e2e_per_token_s,
    per_request_tpot_s,
)
from kvstudy.bench.result import RequestRecord, requests_from_result


def test_steady_stream_is_measurable(helpers: Any) -> None:
    h = helpers
    m = assess_run(h.steady_run(), "run", expected_output_len=32, clock_interval_s=0.25, clock_samples_in_window=3)
    assert m.measurable and m.reasons == []
    assert m.near_zero_gap_share == 0.0 and m.chunks_per_token == 1.0
    assert m.tpot_requests == 8 and m.failed == 0 and m.short_outputs == 0


def test_all_gaps_near_zero_after_first_token_is_not_measurable(helpers: Any) -> None:
    h = helpers
    # the fp8 cells: a 60 ms first token, then all 31 remaining tokens at once
    run = h.steady_run(gap_s=0.0, ttft_s=0.06)
    m = assess_run(run, "run")
    assert not m.measurable
    assert m.near_zero_gap_share == 1.0
    assert any("bursts" in r for r in m.reasons)
    assert float(np.median(per_request_tpot_s(run))) == 0.0


def test_one_chunk_for_all_tokens_is_not_measurable() -> None:
    n = 4
    run = [
        RequestRecord(index=i, start_time_s=None, ttft_ms=60.0, e2el_ms=60.1, tpot_ms=None, output_len=32)
        for i in range(n)
    ]
    m = assess_run(run, "run")
    assert not m.measurable
    assert m.chunks_per_token == pytest.approx(1 / 32)
    assert any("chunks per output token" in r for r in m.reasons)


def test_gap_share_threshold_is_a_boundary(helpers: Any) -> None:
    h = helpers

    # 31 gaps: 7 near zero (22.6 %) passes, 8 (25.8 %) does not
    def run_with(zeros: int) -> list[RequestRecord]:
        gaps_ms = [NEAR_ZERO_GAP_S / 2 * 1e3] * zeros + [20.0] * (31 - zeros)
        return [replace(h.steady_run(n=1)[0], itls_ms=gaps_ms)]

    assert 7 / 31 <= MAX_NEAR_ZERO_GAP_SHARE < 8 / 31
    assert assess_run(run_with(7), "run").measurable
    assert not assess_run(run_with(8), "run").measurable


def test_short_output_only_when_the_asked_length_is_known(helpers: Any) -> None:
    h = helpers
    run = h.steady_run(n=2)
    run[1] = replace(run[1], output_len=20)
    assert assess_run(run, "run").measurable
    m = assess_run(run, "run", expected_output_len=32)
    assert not m.measurable and m.short_outputs == 1
    assert any("fewer than the 32" in r for r in m.reasons)


def test_failed_request_is_not_measurable(helpers: Any) -> None:
    h = helpers
    run = h.steady_run(n=3)
    run[1] = replace(run[1], success=False)
    m = assess_run(run, "run")
    assert not m.measurable and m.failed == 1
    assert any("1 of 3 requests failed" in r for r in m.reasons)
    assert per_request_tpot_s(run).size == 2


def test_single_token_outputs_have_no_tpot(helpers: Any) -> None:
    h = helpers
    run = h.steady_run(n=2, out=1)
    m = assess_run(run, "run")
    assert not m.measurable and m.tpot_requests == 0


def test_window_shorter_than_clock_sampling(helpers: Any) -> None:
    h = helpers
    m = assess_run(h.steady_run(), "run", duration_s=0.1, clock_interval_s=0.25)
    assert not m.measurable and any("clock sampling interval" in r for r in m.reasons)
    assert assess_run(h.steady_run(), "run", duration_s=1.0, clock_interval_s=0.25).measurable
    assert not assess_run(h.steady_run(), "run", duration_s=1.0, clock_samples_in_window=0).measurable


def test_tpot_follows_vllm_on_a_bundled_result(helpers: Any) -> None:
    h = helpers
    data = h.bundled("auto__s0__u1")
    run = requests_from_result(data, "auto__s0__u1.json")
    assert float(np.median(per_request_tpot_s(run))) * 1e3 == pytest.approx(data["median_tpot_ms"], rel=1e-9)
    assert float(np.mean(per_request_tpot_s(run))) * 1e3 == pytest.approx(data["mean_tpot_ms"], rel=1e-9)
    e2e = per_request_e2e_per_token_s(run)
    assert e2e.size == data["num_prompts"] and np.all(e2e > 0)


def test_project_request_rows_match_the_cell(helpers: Any) -> None:
    """Every bundled cell that ran: its request rows give the cell's median TPOT (vLLM's definition),
    and each measurable run the capture offers is judged measurable from the rows alone."""
    h = helpers
    ok_cells = [
        c
        for c in (json.loads(p.read_text(encoding="utf-8")) for p in sorted(h.BUNDLED_CELLS.glob("*.json")))
        if c["status"] == "ok"
    ]
    assert ok_cells
    for cell in ok_cells:
        run = h.bundled_run(cell)
        assert float(np.median(per_request_tpot_s(run))) * 1e3 == pytest.approx(
            cell["metrics"]["median_tpot_ms"], rel=1e-6
        ), cell["cell_id"]
    measurable = h.measurable_cells("auto", 4) + h.measurable_cells("auto", 1)
    assert measurable, "the bundled capture has no measurable baseline run"
    cell = h.bundled_cell(measurable[0])
    m = assess_run(
        h.bundled_run(cell),
        cell["cell_id"],
        duration_s=cell["metrics"]["duration_s"],
        expected_output_len=cell["settings"]["output_len"],
        clock_interval_s=0.25,
    )
    assert m.measurable, m.reasons
