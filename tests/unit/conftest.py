"""Helpers shared by the bench-layer and the speed tests: synthetic runs and the bundled speed capture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench.measurability import assess_run
from kvstudy.bench.result import RequestRecord, read_requests_jsonl

ROOT = Path(__file__).resolve().parents[2]
BUNDLED_BENCH = ROOT / "data" / "captures" / "speed-cpu" / "bench"
BUNDLED_REQUESTS = ROOT / "data" / "captures" / "speed-cpu" / "requests"
BUNDLED_CELLS = ROOT / "data" / "captures" / "speed-cpu" / "cells"


def steady_run(n: int = 8, out: int = 32, gap_s: float = 0.02, ttft_s: float = 0.1) -> list[RequestRecord]:
    """The requests of a run whose tokens arrive one decode step (``gap_s``) apart."""
    return [
        RequestRecord(
            index=i,
            start_time_s=None,
            ttft_ms=ttft_s * 1e3,
            e2el_ms=(ttft_s + gap_s * (out - 1)) * 1e3,
            tpot_ms=None,
            itls_ms=[gap_s * 1e3] * (out - 1),
            output_len=out,
        )
        for i in range(n)
    ]


def bundled(name: str) -> dict[str, Any]:
    """One bundled vLLM 0.32 bench result (``bench/<name>.json``) as a dict."""
    return json.loads((BUNDLED_BENCH / f"{name}.json").read_text(encoding="utf-8"))


def bundled_cell(cell_id: str) -> dict[str, Any]:
    """One bundled cell record (``cells/<cell_id>.json``) as a dict."""
    return json.loads((BUNDLED_CELLS / f"{cell_id}.json").read_text(encoding="utf-8"))


def bundled_run(cell: dict[str, Any]) -> list[RequestRecord]:
    """The per-request rows of a bundled cell."""
    return read_requests_jsonl(BUNDLED_REQUESTS / f"{cell['cell_id']}.jsonl")


def measurable_cells(configuration: str, users: int) -> list[str]:
    """Ids of the bundled cells of ``configuration`` at ``users`` that ran and measured per-token
    latency, in seed order: chosen by reading the capture, so the tests follow a re-made capture."""
    found: list[tuple[int, str]] = []
    for path in sorted(BUNDLED_CELLS.glob("*.json")):
        cell = json.loads(path.read_text(encoding="utf-8"))
        if cell["configuration"] != configuration or cell["users"] != users or cell["status"] != "ok":
            continue
        m = assess_run(
            bundled_run(cell),
            cell["cell_id"],
            duration_s=cell["metrics"]["duration_s"],
            expected_output_len=cell["settings"]["output_len"],
            clock_interval_s=cell["clock_interval_s"],
            clock_samples_in_window=cell["clock_samples_in_window"],
        )
        if m.measurable:
            found.append((int(cell["seed"]), str(cell["cell_id"])))
    return [cell_id for _, cell_id in sorted(found)]


@pytest.fixture
def helpers() -> Any:
    """The helpers above, for tests (with --import-mode=importlib a conftest cannot be imported)."""
    import types

    return types.SimpleNamespace(
        steady_run=steady_run,
        bundled=bundled,
        bundled_cell=bundled_cell,
        bundled_run=bundled_run,
        measurable_cells=measurable_cells,
        BUNDLED_BENCH=BUNDLED_BENCH,
        BUNDLED_REQUESTS=BUNDLED_REQUESTS,
        BUNDLED_CELLS=BUNDLED_CELLS,
    )


def retrieval_items(outcomes: dict[int, str], n_keys: int = 10) -> list[Any]:
    """Retrieval records, three items per context; outcomes: length -> '1'/'0' (right/wrong) per item."""
    from kvstudy.accuracy.records import RetrievalRecord

    records = []
    for length, pattern in outcomes.items():
        for i, ch in enumerate(pattern):
            answer = "12345" if ch == "1" else "1"
            context = f"kv-{length}-{i // 3}"
            item = (f"kv-{length}-{i}", "h", "kv", context, length, length, 0.5, n_keys, "12345", " " + answer, answer)
            records.append(RetrievalRecord(len(records), *item, ch == "1"))
    return records


def question_items(pattern: str, response: str = "#### 1") -> list[Any]:
    """GSM8K-format records; pattern: '1'/'0' (right/wrong) per question."""
    from kvstudy.accuracy.records import QuestionRecord

    return [QuestionRecord(i, f"h{i}", "1", response, "1", ch == "1", "1", ch == "1") for i, ch in enumerate(pattern)]


def config_result(name: str, records: list[Any], shots: int | None = 8, state: str = "ok") -> Any:
    """A configuration as read from a capture, labelled with its name in capitals."""
    from kvstudy.accuracy.runner import ConfigResult

    return ConfigResult(name=name, label=name.upper(), state=state, num_fewshot=shots, records=records)


@pytest.fixture
def acc() -> Any:
    """The accuracy record builders above."""
    import types

    return types.SimpleNamespace(items=retrieval_items, questions=question_items, config=config_result)
