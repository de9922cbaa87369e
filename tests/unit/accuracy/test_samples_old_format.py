"""lm-eval sample files from before 0.4.2 (issue 30 item 6): one JSON array per task, rows without a
``filter`` key (nor ``metrics`` or hashes). What the paired test needs is there, so they are read;
a file whose rows repeat a doc_id without naming their filter is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvstudy import cli
from kvstudy.accuracy.records import UNNAMED_FILTER, read_pair, read_samples
from kvstudy.errors import StudyError

OLD = Path(__file__).resolve().parents[2] / "fixtures" / "lm-eval-samples-0.4.0"
NAME = "pretrained__Qwen__Qwen3-8B_gsm8k.jsonl"


def test_an_old_array_file_is_read() -> None:
    f = read_samples(OLD / "baseline" / NAME)
    assert f.filter == UNNAMED_FILTER
    assert f.doc_ids == tuple(range(8)) and sum(f.correctness().values()) == 6
    assert f.rows[0].doc_digest is not None and f.rows[0].doc_hash is None


def test_two_old_files_pair_and_compare(capsys: pytest.CaptureFixture[str]) -> None:
    pair = read_pair(OLD / "baseline" / NAME, OLD / "candidate" / NAME)
    assert pair.same_prompts is None
    lost = [d for d in pair.doc_ids if pair.baseline.correctness()[d] and not pair.candidate.correctness()[d]]
    assert lost == [1, 5]
    assert cli.main(["accuracy", "compare", str(OLD / "baseline" / NAME), str(OLD / "candidate" / NAME), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    counts = data["counts"]
    assert sum(counts.values()) == 8 and (counts["baseline_only"], counts["candidate_only"]) == (2, 0)


def _strip(rows: list[dict], *keys: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in keys} for r in rows]


def test_json_lines_without_filter_key_are_read(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = _strip(lmeval.rows_for({0: True, 1: False, 2: True}, filters=["strict-match"]), "filter", "metrics")
    path = lmeval.write_rows(tmp_path / "samples_gsm8k_2024-03-01T10-00-00.000000.jsonl", rows)
    f = read_samples(path)
    assert f.task == "gsm8k" and f.filter == UNNAMED_FILTER and f.correctness() == {0: True, 1: False, 2: True}


def test_unnamed_rows_of_several_filters_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = _strip(lmeval.rows_for({0: True, 1: False}), "filter")  # two filters, names dropped
    path = lmeval.write_rows(tmp_path / "two.jsonl", rows)
    with pytest.raises(StudyError, match="filters cannot be told apart") as err:
        read_samples(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_mixed_named_and_unnamed_rows_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = lmeval.rows_for({0: True, 1: False}, filters=["strict-match"])
    rows[1].pop("filter")
    with pytest.raises(StudyError, match="some rows name a filter"):
        read_samples(lmeval.write_rows(tmp_path / "mixed.jsonl", rows))


@pytest.mark.parametrize("text", ["[1, 2]", '[{"doc": {}}]', "[]", "[" * 5000])
def test_a_bad_array_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(StudyError) as err:
        read_samples(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
