"""The metrics of one bench run from its per-request records, with vLLM's definitions.

:class:`CellMetrics` names them once (units in the names, as vLLM's ``BenchmarkMetrics``), and
:func:`calculate_metrics` computes them from :class:`kvstudy.bench.result.RequestRecord` rows the
way vLLM does, so a capture can be re-analysed without vLLM. :func:`metrics_reported_by_vllm` reads
the figures the client itself printed and saved, under the same names, to set beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstudy.bench.result import RequestRecord
from kvstudy.errors import StudyError


@dataclass
class CellMetrics:
    """The metrics of one cell, as vLLM's ``BenchmarkMetrics`` defines them (units in names)."""

    completed: int  # successful requests
    failed: int  # failed requests
    duration_s: float  # benchmark duration (warm-ups excluded)
    total_input_tokens: int
    total_output_tokens: int
    request_throughput_req_s: float  # completed / duration
    output_throughput_tok_s: float  # output tokens / duration
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float  # per request (e2el - ttft) / (output tokens - 1)
    median_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float  # all inter-token gaps pooled
    median_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p99_e2el_ms: float


STATS = ("mean", "median", "p99")


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    arr = np.asarray(values if len(values) else [0.0], dtype=float)
    return float(np.mean(arr)), float(np.median(arr)), float(np.percentile(arr, 99))


def calculate_metrics(records: Sequence[RequestRecord], duration_s: float) -> CellMetrics:
    """Metrics from per-request records with vLLM's definitions (empty lists count as 0, as there)."""
    if duration_s <= 0:
        raise StudyError(f"duration_s: must be positive, got {duration_s}")
    ok = [r for r in records if r.success]
    samples = {
        "ttft": [r.ttft_ms for r in ok],
        "tpot": [r.tpot_ms for r in ok if r.tpot_ms is not None],
        "itl": [x for r in ok for x in r.itls_ms],
        "e2el": [r.e2el_ms for r in ok],
    }
    out_tokens = sum(r.output_len for r in ok)
    return CellMetrics(
        completed=len(ok),
        failed=len(records) - len(ok),
        duration_s=duration_s,
        total_input_tokens=sum(r.input_len or 0 for r in ok),
        total_output_tokens=out_tokens,
        request_throughput_req_s=len(ok) / duration_s,
        output_throughput_tok_s=out_tokens / duration_s,
        **{
            f"{stat}_{name}_ms": value for name, values in samples.items() for stat, value in zip(STATS, _stats(values))
        },
    )


# CellMetrics' names that vLLM's result spells without the unit (the rest are spelled alike).
VLLM_NAMES = {
    "duration_s": "duration",
    "request_throughput_req_s": "request_throughput",
    "output_throughput_tok_s": "output_throughput",
}


def metrics_reported_by_vllm(result: dict[str, Any]) -> dict[str, float | None]:
    """The summary numbers vLLM's client printed and saved, under :class:`CellMetrics` names."""
    return {name: result.get(VLLM_NAMES.get(name, name)) for name in CellMetrics.__dataclass_fields__}
