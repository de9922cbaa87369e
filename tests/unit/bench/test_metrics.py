"""vLLM's metric definitions computed from per-request records, and the figures vLLM reported (no vLLM)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvstudy.bench import result as bm
from kvstudy.bench.result import requests_from_result
from kvstudy.errors import StudyError


def test_metrics_follow_vllm_definitions(vllm_result: dict[str, Any]) -> None:
    recs = requests_from_result(vllm_result)
    m = bm.calculate_metrics(recs, 2.0)
    assert (m.completed, m.failed, m.total_output_tokens, m.total_input_tokens) == (2, 1, 10, 64)
    assert m.output_throughput_tok_s == 5.0 and m.request_throughput_req_s == 1.0
    assert m.median_tpot_ms == pytest.approx(125.0)
    assert m.median_ttft_ms == pytest.approx(150.0)
    assert m.median_itl_ms == pytest.approx(125.0)  # eight gaps pooled: four of 100, four of 150
    assert m.p99_e2el_ms == pytest.approx(np.percentile([500.0, 800.0], 99))
    reported = bm.metrics_reported_by_vllm(vllm_result)
    assert reported["median_tpot_ms"] == 125.0 and reported["duration_s"] == 2.0
    assert reported["median_ttft_ms"] is None  # not in this result: not invented


def test_one_token_outputs_are_left_out_of_tpot(vllm_result: dict[str, Any]) -> None:
    r = vllm_result
    r["output_lens"] = [1, 5, 0]
    assert bm.calculate_metrics(requests_from_result(r), 1.0).median_tpot_ms == pytest.approx(150.0)


def test_duration_must_be_positive(vllm_result: dict[str, Any]) -> None:
    with pytest.raises(StudyError, match="duration_s"):
        bm.calculate_metrics(requests_from_result(vllm_result), 0.0)
