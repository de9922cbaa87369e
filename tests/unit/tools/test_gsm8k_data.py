"""The generated GSM8K-format set and the offline lm-eval task that reads it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from kvstudy.errors import StudyError
from kvstudy.tools import train_data

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "data" / "gsm8k"
TASK = ROOT / "src" / "kvstudy" / "accuracy" / "tasks" / "gsm8k_offline.yaml"
CALC = re.compile(r"<<([0-9+\-*/ ]+)=(-?\d+)>>(-?\d+)")


def test_bundled_files_are_what_the_generator_writes(tmp_path):
    written = train_data.write_splits(tmp_path)
    for split, path in written.items():
        assert path.read_bytes() == (DATA / f"{split}.jsonl").read_bytes(), split


def test_sizes_and_no_overlap():
    test = train_data.read_split(DATA / "test.jsonl")
    train = train_data.read_split(DATA / "train.jsonl")
    assert len(test) >= 500 and len(train) >= 8
    assert not {p.question for p in test} & {p.question for p in train}
    assert len({p.question for p in test}) == len(test)


def test_every_worked_step_and_final_answer_is_right():
    for problem in train_data.read_split(DATA / "test.jsonl") + train_data.read_split(DATA / "train.jsonl"):
        steps = CALC.findall(problem.answer)
        assert len(steps) >= 2, problem
        for expr, value, shown in steps:
            assert value == shown
            assert eval(expr.replace("/", "//")) == int(value), (expr, value)  # noqa: S307 (digits and + - * / only)
            assert "/" not in expr or eval(expr) == int(value)  # divisions are exact
        final = train_data.final_answer(problem.answer)
        assert final == steps[-1][1], problem
        assert int(final) > 0


def test_different_seed_gives_different_problems():
    a = train_data.generate(20, 8, seed=1)["test"]
    b = train_data.generate(20, 8, seed=2)["test"]
    assert a != b
    assert a == train_data.generate(20, 8, seed=1)["test"]


def test_a_problem_holding_line_separators_reads_back(tmp_path):
    problem = train_data.Problem("How many\u2028apples?\x85", "Two and two.\u2029\n#### 4")
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(dataclasses.asdict(problem), ensure_ascii=False) + "\n", encoding="utf-8")
    assert train_data.read_split(path) == [problem]


def test_bad_input_is_one_line_error(tmp_path):
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"question": "q", "answer": "no final answer"}\n')
    with pytest.raises(StudyError, match="####"):
        train_data.read_split(bad)
    bad.write_text('{"question": 3}\n')
    with pytest.raises(StudyError, match=r"test.jsonl:1"):
        train_data.read_split(bad)
    with pytest.raises(StudyError, match="n_train"):
        train_data.generate(10, 2)


def _lm_eval_gsm8k() -> dict:
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is part of `make engine`")
    return yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())


def test_offline_task_mirrors_lm_eval_gsm8k():
    ours, theirs = yaml.safe_load(TASK.read_text()), _lm_eval_gsm8k()
    for key in (
        "output_type",
        "training_split",
        "fewshot_split",
        "test_split",
        "doc_to_text",
        "doc_to_target",
        "generation_kwargs",
        "filter_list",
        "repeats",
        "num_fewshot",
    ):
        assert ours[key] == theirs[key], key
    assert ours["metric_list"] == theirs["metric_list"]
    assert ours["metadata"]["version"] == theirs["metadata"]["version"]
    assert ours["dataset_path"] == "json"
    assert set(ours["dataset_kwargs"]["data_files"]) == {"train", "test"}


def test_offline_task_loads_in_lm_eval(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from kvstudy.accuracy.configurations import write_task_folder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = write_task_folder("gsm8k_offline", DATA, tmp_path / "task")
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    task = manager.load(["gsm8k_offline"])["tasks"]["gsm8k_offline"]
    docs = list(task.test_docs())
    first = json.loads((DATA / "test.jsonl").read_text().splitlines()[0])
    assert len(docs) == len(train_data.read_split(DATA / "test.jsonl"))
    assert task.doc_to_text(docs[0]) == f"Question: {first['question']}\nAnswer:"
    assert len(list(task.fewshot_docs())) == len(train_data.read_split(DATA / "train.jsonl"))


def test_missing_data_folder_is_a_study_error(tmp_path):
    from kvstudy.accuracy.configurations import write_task_folder

    with pytest.raises(StudyError, match="train split is missing"):
        write_task_folder("gsm8k_offline", tmp_path / "nowhere", tmp_path / "task")
