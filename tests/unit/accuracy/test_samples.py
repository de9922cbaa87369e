"""Reading lm-eval --log_samples files (0.4.13's format) and pairing two runs by doc_id."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvstudy.accuracy import records as smp
from kvstudy.errors import StudyError
from kvstudy.stats import binary as stats

BASE = {i: i % 7 != 0 for i in range(40)}  # 34 right
CAND = {i: (i % 7 != 0) != (i in (3, 8, 21)) or i == 14 for i in range(40)}


def test_reads_one_filter_keyed_by_doc_id(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    path = lmeval.write_samples(tmp_path, BASE)
    s = smp.read_samples(path)
    assert s.task == "gsm8k"
    assert smp.read_samples(path, "flexible-extract").filter == "flexible-extract"  # the file holds both
    assert s.filter == "strict-match" and s.metric == "exact_match"
    assert s.doc_ids == tuple(range(40))
    assert s.correctness() == BASE
    row = s.rows[0]
    assert row.gen_limit == 256 and row.response.startswith(" Tom had 0 apples")
    assert row.doc_hash is not None and row.prompt_hash is not None


def test_pairs_files_written_in_different_orders(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    base = lmeval.write_samples(tmp_path, BASE, run="bf16")
    cand = lmeval.write_samples(tmp_path, dict(reversed(CAND.items())), run="fp8", shuffle_seed=7)
    lines = [json.loads(x)["doc_id"] for x in cand.read_text().splitlines()]
    assert lines[:40] != list(range(40))  # really another order
    pair = smp.read_pair(base, cand)
    assert pair.doc_ids == tuple(range(40)) and pair.same_prompts
    v = stats.compare(pair.baseline.correctness(), pair.candidate.correctness(), margin_points=1)
    expected = stats.paired_counts(BASE, CAND)
    assert v.counts == expected
    assert (expected.baseline_only, expected.candidate_only) == (2, 2)


def test_filter_picks_the_rows_of_that_filter(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = lmeval.rows_for({0: True, 1: True}, filters=["strict-match"]) + lmeval.rows_for(
        {0: False, 1: True}, filters=["flexible-extract"]
    )
    path = lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows)
    assert smp.read_samples(path).correctness() == {0: True, 1: True}
    assert smp.read_samples(path, "flexible-extract").correctness() == {0: False, 1: True}


def test_task_from_file_name(lmeval: SimpleNamespace) -> None:
    assert smp.task_from_name(f"samples_gsm8k_{lmeval.DATE}.jsonl") == "gsm8k"
    assert smp.task_from_name(f"samples_gsm8k_offline_{lmeval.DATE}.jsonl") == "gsm8k_offline"
    assert smp.task_from_name("samples_gsm8k_2026-01-02T03-04-05.jsonl") == "gsm8k"
    assert smp.task_from_name("records.jsonl") is None


# --------------------------------------------------------------------------- bad input


def one_line_error(exc: pytest.ExceptionInfo[StudyError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_different_tasks_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    base = lmeval.write_samples(tmp_path, BASE, task="gsm8k", run="a")
    cand = lmeval.write_samples(tmp_path, BASE, task="gsm8k_offline", run="b")
    with pytest.raises(StudyError) as exc:
        smp.read_pair(base, cand)
    message = one_line_error(exc)
    assert str(cand) in message and "'gsm8k_offline'" in message and "'gsm8k'" in message


def test_task_in_rows_must_agree_with_the_file_name(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    path = lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", lmeval.rows_for({0: True}, task="mmlu"))
    with pytest.raises(StudyError, match="file name says task 'gsm8k', the rows 'mmlu'"):
        smp.read_samples(path)


def test_different_document_sets_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    base = lmeval.write_samples(tmp_path, BASE, run="a")
    cand = lmeval.write_samples(tmp_path, {i: True for i in range(5, 45)}, run="b")
    with pytest.raises(StudyError) as exc:
        smp.read_pair(base, cand)
    message = one_line_error(exc)
    assert str(cand) in message and "[0, 1, 2, 3, 4]" in message and "[40, 41, 42, 43, 44]" in message


def test_same_doc_id_with_another_document_is_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    base = lmeval.write_samples(tmp_path, {0: True, 1: True}, run="a")
    other = {"question": "Something else entirely?", "answer": "x\n#### 1"}
    rows = [lmeval.gsm8k_row(0, True, f) for f in ("strict-match", "flexible-extract")]
    rows += [lmeval.gsm8k_row(1, True, f, doc=other) for f in ("strict-match", "flexible-extract")]
    cand = lmeval.write_rows(tmp_path / "b" / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows)
    with pytest.raises(StudyError, match="doc_id 1 is a different document"):
        smp.read_pair(base, cand)


def test_documents_compared_by_doc_when_no_hash_is_logged(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    def rows(doc1: dict[str, str]) -> list[dict[str, object]]:
        out = lmeval.rows_for({0: True}) + [
            lmeval.gsm8k_row(1, True, f, doc=doc1) for f in ("strict-match", "flexible-extract")
        ]
        for r in out:
            del r["doc_hash"], r["target_hash"]
        return out

    base = lmeval.write_rows(tmp_path / "a" / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows(lmeval.gsm8k_doc(1)))
    cand = lmeval.write_rows(
        tmp_path / "b" / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows({**lmeval.gsm8k_doc(1), "question": "changed"})
    )
    with pytest.raises(StudyError, match="doc_id 1 is a different document"):
        smp.read_pair(base, cand)
    assert smp.read_pair(base, base).doc_ids  # the same documents pair


def test_one_doc_id_must_be_one_document_within_a_file(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = [
        lmeval.gsm8k_row(0, True, "strict-match"),
        lmeval.gsm8k_row(0, True, "flexible-extract", doc={"question": "?", "answer": "#### 2"}),
    ]
    path = lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows)
    with pytest.raises(StudyError, match="doc_id 0 is a different document under filters"):
        smp.read_samples(path)


def test_missing_filter_lists_the_ones_there(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    path = lmeval.write_samples(tmp_path, BASE)
    with pytest.raises(StudyError) as exc:
        smp.read_samples(path, "maj@8")
    message = one_line_error(exc)
    assert str(path) in message and "'maj@8'" in message
    assert "['flexible-extract', 'strict-match']" in message


def test_duplicate_doc_ids_for_one_filter_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = lmeval.rows_for({0: True, 1: False}) + [lmeval.gsm8k_row(1, False, "strict-match")]
    path = lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows)
    with pytest.raises(
        StudyError,
        match=r"doc_ids \[1\] appear more than once for filter "
        r"'strict-match'",
    ):
        smp.read_samples(path)


def test_missing_metric_names_the_metrics_there(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    path = lmeval.write_samples(tmp_path, BASE)
    with pytest.raises(StudyError, match=r"no numeric metric 'acc'; it has \['exact_match'\]"):
        smp.read_samples(path, metric="acc")


def test_non_binary_metric_cannot_be_paired_as_right_or_wrong(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = lmeval.rows_for({0: True}, filters=["strict-match"])
    rows[0]["exact_match"] = 0.5
    path = lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows)
    s = smp.read_samples(path)
    with pytest.raises(StudyError, match="exact_match is 0.5, expected 0 or 1"):
        s.correctness()


def test_missing_file_directory_and_fifo_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="absent.jsonl: file not found"):
        smp.read_samples(tmp_path / "absent.jsonl")
    with pytest.raises(StudyError, match="is a directory"):
        smp.read_samples(tmp_path)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(StudyError, match="not a regular file"):
        smp.read_samples(fifo)  # must not block on open


def test_huge_and_empty_files_are_refused(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    path = lmeval.write_samples(tmp_path, BASE)
    with pytest.raises(StudyError, match="larger than the 1000-byte limit"):
        smp.read_samples(path, max_bytes=1000)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(StudyError, match="empty.jsonl: no rows"):
        smp.read_samples(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(StudyError, match="no rows"):
        smp.read_samples(blank)


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"doc_id": 0, "filter": "strict-match"', "not an lm-eval sample row"),
        ("[1, 2, 3]", "expected a valid dictionary"),
        ('{"filter": "strict-match", "exact_match": 1.0}', "doc_id: a required field is missing"),
        ('{"doc_id": -3, "filter": "strict-match", "exact_match": 1.0}', "doc_id: expected greater than or equal to 0"),
        ('{"doc_id": "7", "filter": "strict-match", "exact_match": 1.0}', "doc_id: expected a valid integer"),
        ('{"doc_id": 7, "filter": 3, "exact_match": 1.0}', "filter: expected a valid string"),
        ('{"doc_id": 7, "filter": "x", "metrics": "exact_match"}', "metrics: expected a valid list"),
        ('{"doc_id": 7, "filter": "x", "doc_hash": 12}', "doc_hash: expected a valid string"),
    ],
)
def test_malformed_lines_name_the_file_and_line(
    tmp_path: Path, line: str, problem: str, lmeval: SimpleNamespace
) -> None:
    path = tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl"
    good = json.dumps(lmeval.gsm8k_row(0, True))
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(StudyError) as exc:
        smp.read_samples(path)
    message = one_line_error(exc)
    assert message.startswith(f"{path}:2:") and problem in message


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"doc_id": 0, "filter": "strict-match", "q": "\xe9"}\n')
    with pytest.raises(StudyError, match="not UTF-8"):
        smp.read_samples(path)


# --------------------------------------------------------------------------- cut-off answers


def test_cut_off_when_the_rows_say_so(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = [
        lmeval.gsm8k_row(0, True, finish_reason="stop"),
        lmeval.gsm8k_row(1, False, finish_reason="length"),
        lmeval.gsm8k_row(2, False, truncated=True),
    ]
    s = smp.read_samples(lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows))
    t = smp.cut_off_answers(s)
    assert t.method == "rows" and t.cut_off == (1, 2) and t.checked == 3
    assert "2 of 3 answers" in t.sentence()


def test_cut_off_by_the_logged_limit_in_words(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    long = " step" * 20
    rows = [lmeval.gsm8k_row(0, True, max_gen_toks=16), lmeval.gsm8k_row(1, False, response=long, max_gen_toks=16)]
    s = smp.read_samples(lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows))
    words = smp.cut_off_answers(s)
    assert words.limit == 16 and words.cut_off == (1,) and "lower bound" in words.method
    assert "1 of 2 answers stopped at the generation limit (at 16 tokens, counted as words" in words.sentence()


def test_cut_off_not_checked_without_a_limit(tmp_path: Path, lmeval: SimpleNamespace) -> None:
    rows = lmeval.rows_for({0: True})
    for r in rows:
        del r["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"]
    s = smp.read_samples(lmeval.write_rows(tmp_path / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows))
    t = smp.cut_off_answers(s)
    assert t.method == "not checked" and t.cut_off == () and "not checked" in t.sentence()
