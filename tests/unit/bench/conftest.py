"""A small result of the shape vLLM's client saves, for the bench-layer tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def vllm_result() -> dict[str, Any]:
    """The shape vLLM 0.32's `--save-result --save-detailed` writes, with three requests (a fresh copy per test)."""
    return {
        "duration": 2.0,
        "completed": 2,
        "failed": 1,
        "start_times": [10.0, 10.5, 11.0],
        "ttfts": [0.10, 0.20, 0.0],
        "latencies": [0.50, 0.80, 0.0],
        "itls": [[0.1, 0.1, 0.1, 0.1], [0.15, 0.15, 0.15, 0.15], []],
        "input_lens": [32, 32, 32],
        "output_lens": [5, 5, 0],
        "errors": ["", "", "Server disconnected"],
        "median_tpot_ms": 125.0,
    }
