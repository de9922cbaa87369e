"""The one reader of vLLM's saved bench result: per-request records, every entry checked (no vLLM)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench import result as br
from kvstudy.errors import StudyError
from kvstudy.io import write_jsonl_atomic


def test_records_from_result_compute_tpot_and_failures(vllm_result: dict[str, Any]) -> None:
    recs = br.requests_from_result(vllm_result)
    assert [r.success for r in recs] == [True, True, False]
    assert recs[0].tpot_ms == pytest.approx(100.0) and recs[1].tpot_ms == pytest.approx(150.0)
    assert recs[2].tpot_ms is None and recs[2].error == "Server disconnected"
    assert recs[1].ttft_ms == pytest.approx(200.0) and recs[1].itls_ms == pytest.approx([150.0] * 4)
    assert recs[1].end_time_s == pytest.approx(11.3)
    assert [r.input_len for r in recs] == [32, 32, 32] and [r.index for r in recs] == [0, 1, 2]


def test_one_token_outputs_have_no_tpot(vllm_result: dict[str, Any]) -> None:
    r = vllm_result
    r["output_lens"] = [1, 5, 0]
    recs = br.requests_from_result(r)
    assert recs[0].tpot_ms is None and recs[0].success


def test_result_without_detail_is_refused(vllm_result: dict[str, Any]) -> None:
    r = copy.deepcopy(vllm_result)
    del r["itls"]
    with pytest.raises(StudyError, match=r"bench/x.json: no per-request data \(itls missing\).*--save-detailed"):
        br.requests_from_result(r, where="bench/x.json")
    r = vllm_result
    r["ttfts"] = r["ttfts"][:2]
    with pytest.raises(StudyError, match="ttfts has 2 entries, expected a list of 3"):
        br.requests_from_result(r)


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("latencies", "x", "latencies: expected a valid list, got 'x'"),
        ("ttfts", [0.1, None, 0.0], r"ttfts\[1\]: expected a valid number, got None"),
        ("latencies", [0.5, -0.8, 0.0], r"latencies\[1\]: expected greater than or equal to 0, got -0.8"),
        ("output_lens", [5, 4.5, 0], r"output_lens\[1\]: expected a valid integer, got 4.5"),
        ("output_lens", [5, 10**400, 0], r"output_lens\[1\]"),
        ("itls", [[0.1], [float("nan")], []], r"itls\[1\]\[0\]: expected a finite number"),
        ("errors", ["", 3, ""], r"errors\[1\]: expected a valid string, got 3"),
        ("start_times", [10.0, 10.5], "start_times has 2 entries"),
        ("input_lens", [32, "32", 32], r"input_lens\[1\]: expected a valid integer, got '32'"),
    ],
)
def test_malformed_entries_are_refused(key: str, value: Any, needle: str, vllm_result: dict[str, Any]) -> None:
    r = vllm_result
    r[key] = value
    with pytest.raises(StudyError, match=f"bench/x.json: {needle}"):
        br.requests_from_result(r, where="bench/x.json")


def test_arrays_older_clients_did_not_save_are_optional(vllm_result: dict[str, Any]) -> None:
    r = copy.deepcopy(vllm_result)
    del r["start_times"], r["input_lens"]
    recs = br.requests_from_result(r)
    assert all(x.start_time_s is None and x.end_time_s is None and x.input_len is None for x in recs)
    assert [x.tpot_ms for x in recs] == [x.tpot_ms for x in br.requests_from_result(vllm_result)]


def test_a_minimum_number_of_requests() -> None:
    r = {k: [] for k in br.DETAILED_ARRAYS}
    assert br.requests_from_result(r) == []
    with pytest.raises(StudyError, match="0 requests, expected at least 1"):
        br.requests_from_result(r, min_requests=1)


def test_records_round_trip_jsonl(tmp_path: Path, vllm_result: dict[str, Any]) -> None:
    recs = br.requests_from_result(vllm_result)
    write_jsonl_atomic(tmp_path / "r.jsonl", recs)
    assert br.read_requests_jsonl(tmp_path / "r.jsonl") == recs
    (tmp_path / "bad.jsonl").write_text('{"index": 1}\n')
    with pytest.raises(StudyError, match="bad.jsonl:1"):
        br.read_requests_jsonl(tmp_path / "bad.jsonl")


def test_bundled_results_give_the_captured_request_rows(helpers: Any) -> None:
    """Every bundled cell's saved vLLM result, read by this reader, gives exactly the per-request rows
    the sweep wrote for it (``requests/<cell>.jsonl``)."""
    ok = [p for p in sorted(helpers.BUNDLED_CELLS.glob("*.json")) if json.loads(p.read_text())["status"] == "ok"]
    assert ok
    for path in ok:
        cell = json.loads(path.read_text())
        records = br.requests_from_result(helpers.bundled(cell["cell_id"]), where=cell["cell_id"])
        assert records == br.read_requests_jsonl(helpers.BUNDLED_REQUESTS / f"{cell['cell_id']}.jsonl"), path.name


def test_result_files_skip_hidden_and_side_files(tmp_path: Path) -> None:
    for name in ("b.json", "a.json", ".hidden.json", "a.pytorch.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in br.result_files(tmp_path)] == ["a.json", "b.json"]
    with pytest.raises(StudyError, match="not a folder"):
        br.result_files(tmp_path / "a.json")
