"""vLLM's saved bench result read once: the file checks, the per-request records, their JSON lines,
and the metrics of a run from those records, with vLLM's definitions.

``vllm bench serve --save-result --save-detailed`` writes one JSON object per run
(``vllm/benchmarks/serve.py``): the settings ``date`` (local time when the run ended,
``%Y%m%d-%H%M%S``), ``backend``, ``model_id``, ``num_prompts``, ``request_rate``, ``burstiness``,
``max_concurrency``, any ``--metadata KEY=VALUE`` pairs, the run's ``duration`` and summary
metrics, and with ``--save-detailed`` per request ``input_lens``, ``output_lens`` (0 for a failed
request), ``ttfts``, ``itls`` (gaps between streamed chunks, in s), ``latencies``, ``start_times``
(``time.perf_counter()`` in the client) and ``errors`` ("" when the request succeeded).

:func:`requests_from_result` is the one reader of those arrays. ``start_times`` and ``input_lens``
are optional: clients older than January 2026 (vLLM pull request 32667) did not save ``start_times``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.io import read_json_object, read_jsonl
from kvstudy.limits import MAX_CLOCK_MHZ, MAX_FACTOR, MAX_REQUEST_RATE, MAX_TOKENS, MAX_USERS, check_numbers

# A detailed result of 10,000 prompts x 1,000 output tokens is about 200 MB of JSON; beyond this the
# file is not one bench run (or would not fit comfortably in memory once parsed).
MAX_RESULT_BYTES = 256 * 1024 * 1024

# The per-request arrays every --save-detailed result holds, and those older clients did not save.
DETAILED_ARRAYS = ("latencies", "ttfts", "itls", "output_lens", "errors")
OPTIONAL_ARRAYS = ("start_times", "input_lens")
# Numbers the study reads from a result, checked finite and bounded when the file is read (the summary
# statistics are left alone: vLLM writes NaN there for a run whose requests all failed).
CHECKED_NUMBERS = (*DETAILED_ARRAYS, *OPTIONAL_ARRAYS, "num_prompts", "completed", "duration", "max_concurrency")


@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False))
class RequestRecord:
    """One measured request (warm-ups are not among them). Times from vLLM's client; a field of the
    wrong kind (a bool for a count, NaN for a time, an unknown name) is refused when it is built."""

    index: int
    start_time_s: float | None  # time.perf_counter() in the client (CLOCK_MONOTONIC on Linux); None: not saved
    ttft_ms: float  # request start to the first token
    e2el_ms: float  # request start to the last token
    tpot_ms: float | None  # (e2el - ttft) / (output_len - 1); None for <= 1 output token
    itls_ms: list[float] = field(default_factory=list)  # gaps between later tokens
    input_len: int | None = None  # prompt tokens; None: not saved
    output_len: int = 0
    success: bool = True
    error: str = ""

    @property
    def end_time_s(self) -> float | None:
        return None if self.start_time_s is None else self.start_time_s + self.e2el_ms / 1000.0


# --------------------------------------------------------------------------- files


def read_result_file(path: str | Path) -> dict[str, Any]:
    """The JSON object in one result file (``io.read_json``: a regular file of at most
    ``MAX_RESULT_BYTES``), its numbers and the run settings the study reads checked."""
    path = Path(path)
    try:
        data = read_json_object(path, MAX_RESULT_BYTES)
    except StudyError as exc:
        if "(Extra data)" not in str(exc):
            raise
        raise StudyError(
            f"{path}: holds more than one JSON document (written with --append-result?); expected one run per file"
        ) from None
    check_numbers({k: v for k, v in data.items() if k in CHECKED_NUMBERS}, str(path))
    check_run_settings(data, str(path))
    return data


def check_run_settings(data: dict[str, Any], where: str) -> None:
    """The settings of a run the study reads, as vLLM writes them: ``request_rate`` a positive number
    or ``"inf"``, ``burstiness`` positive, ``max_concurrency`` a whole number of users (or null), and
    the ``--metadata`` figures (``median_clock_mhz``, output lengths) real sizes; else one line naming
    the field (an ``Infinity`` or ``1e308`` would otherwise reach a table or a JSON answer)."""
    for key, high in (
        ("request_rate", MAX_REQUEST_RATE),
        ("burstiness", MAX_FACTOR),
        ("max_concurrency", MAX_USERS),
        ("median_clock_mhz", MAX_CLOCK_MHZ),
        ("output_len", MAX_TOKENS),
        ("random_output_len", MAX_TOKENS),
    ):
        value, whole = data.get(key), key == "max_concurrency"
        if value is None or (value == "inf" and key == "request_rate"):  # vLLM writes an unbounded rate "inf"
            continue
        try:  # a number, or the text --metadata stores
            number = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and 0 < number <= high) or (whole and not isinstance(value, int)):
            shown = repr(value[:40]) if isinstance(value, str) else json.dumps(value)[:40]  # JSON's words: Infinity
            what = "a whole number" if whole else "a number"
            raise StudyError(f"{where}: {key} is {shown}, expected {what} above 0 and at most {high:,.0f}")


def result_files(folder: str | Path) -> list[Path]:
    """The result files of a folder: ``*.json``, not hidden, not vLLM's ``*.pytorch.json``; sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StudyError(f"{folder}: not a folder; expected a folder of vllm bench serve result files")
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise StudyError(f"{folder}: cannot be listed ({exc.strerror or exc})") from None
    return [
        p
        for p in entries
        if p.name.endswith(".json") and not p.name.startswith(".") and not p.name.endswith(".pytorch.json")
    ]


# --------------------------------------------------------------------------- per-request records


Time = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0, le=MAX_TOKENS)]


class DetailedArrays(BaseModel):
    """The per-request arrays of a ``--save-detailed`` result (times in s), one entry per request."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    latencies: list[Time]
    ttfts: list[Time]
    itls: list[list[Time]]
    output_lens: list[Count]
    errors: list[str | None]
    start_times: list[Time] | None = None
    input_lens: list[Count] | None = None

    @model_validator(mode="after")
    def _one_per_request(self) -> Self:
        n = len(self.latencies)
        for key in ("ttfts", "itls", "output_lens", "errors", "start_times", "input_lens"):
            values = getattr(self, key)
            if values is not None and len(values) != n:
                raise ValueError(f"{key} has {len(values)} entries, expected a list of {n} (one per request)")
        return self


def requests_from_result(
    data: dict[str, Any], where: str = "bench result", *, min_requests: int = 0
) -> list[RequestRecord]:
    """Per-request records from vLLM's ``--save-detailed`` result object, every entry checked; a
    request succeeded when it has no error text and at least one output token (vLLM's rule)."""
    absent = [k for k in DETAILED_ARRAYS if k not in data]
    if absent:
        raise StudyError(
            f"{where}: no per-request data ({', '.join(absent)} missing); rerun vllm bench serve with "
            "--save-result --save-detailed"
        )
    try:
        arrays = DetailedArrays.model_validate({k: data[k] for k in (*DETAILED_ARRAYS, *OPTIONAL_ARRAYS) if k in data})
    except ValidationError as exc:
        raise StudyError(f"{where}: {one_line(exc)}") from None
    n = len(arrays.latencies)
    if n < min_requests:
        raise StudyError(f"{where}: {n} requests, expected at least {min_requests}")
    records = []
    for i, (lat, ttft, out_len, error) in enumerate(
        zip(arrays.latencies, arrays.ttfts, arrays.output_lens, arrays.errors)
    ):
        success = not error and out_len > 0
        records.append(
            RequestRecord(
                index=i,
                start_time_s=None if arrays.start_times is None else arrays.start_times[i],
                ttft_ms=ttft * 1000.0,
                e2el_ms=lat * 1000.0,
                tpot_ms=(lat - ttft) / (out_len - 1) * 1000.0 if success and out_len > 1 else None,
                itls_ms=[g * 1000.0 for g in arrays.itls[i]],
                input_len=None if arrays.input_lens is None else arrays.input_lens[i],
                output_len=out_len,
                success=success,
                error=error or "",
            )
        )
    return records


def read_requests_jsonl(path: Path) -> list[RequestRecord]:
    """A cell's per-request records, each line checked (one line naming the file, line and field)."""
    return read_jsonl(path, _request, "a request record")


def _request(row: Any) -> RequestRecord:
    try:
        return RequestRecord(**row)
    except ValidationError as exc:  # one line naming the field (read_jsonl adds the file and line)
        raise ValueError(one_line(exc)) from None


# --------------------------------------------------------------------------- metrics, vLLM's definitions
# CellMetrics names them once (units in the names, as vLLM's ``BenchmarkMetrics``); calculate_metrics
# computes them from the per-request records the way vLLM does, so a capture can be re-analysed
# without vLLM; metrics_reported_by_vllm reads what the client itself saved, under the same names.


@dataclasses.dataclass
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
