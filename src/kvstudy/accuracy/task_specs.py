"""The lm-eval tasks the accuracy runner can ask (:data:`TASKS`), and how each one reads its data.

lm-eval's own long-context tasks (``ruler``, ``niah_single_1`` ...) are not wired in: they build
their haystacks at load time with the served model's tokenizer, download NLTK data and essays from
the hub, and their samples carry no context id to cluster on; ``retrieval_offline`` reads local
JSONL written by ``kvstudy retrieval-data`` instead. A task's ``defaults`` hold only the settings in
which it differs from :class:`kvstudy.accuracy.runner.EvalSettings`' own (GSM8K's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvstudy.errors import StudyError

TASK_DIR = Path(__file__).resolve().parent / "tasks"
GSM8K_FILTERS = ("strict-match", "flexible-extract")
RETRIEVAL_FILTERS = ("answer-line",)


@dataclass(frozen=True)
class TaskSpec:
    """One lm-eval task as the runner uses it."""

    name: str  # lm-eval task name
    kind: str  # "gsm8k" or "retrieval": which record type its samples give
    yaml_file: str | None  # packaged task under tasks/ (None: lm-eval's own task)
    splits: tuple[str, ...]  # <split>.jsonl files the packaged task reads from data_dir
    filters: tuple[str, ...]  # lm-eval filter names; one record field per filter
    defaults: Mapping[str, Any] = field(default_factory=dict)  # EvalSettings fields that differ
    data_hint: str = ""  # the command that writes the data folder

    @property
    def offline(self) -> bool:
        return self.yaml_file is not None


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(
            "gsm8k_offline",
            "gsm8k",
            "gsm8k_offline.yaml",
            ("train", "test"),
            GSM8K_FILTERS,
            data_hint="kvstudy gsm8k-data data/gsm8k",
        ),
        TaskSpec("gsm8k", "gsm8k", None, (), GSM8K_FILTERS),
        TaskSpec(
            "retrieval_offline",
            "retrieval",
            "retrieval_offline.yaml",
            ("test",),
            RETRIEVAL_FILTERS,
            defaults={
                "num_fewshot": 0,
                "data_dir": "data/retrieval",
                "max_gen_toks": 16,
                "max_length": 8192,
                "primary_filter": "answer-line",
            },
            data_hint="kvstudy retrieval-data data/retrieval",
        ),
    )
}


def task_spec(name: str) -> TaskSpec:
    """The task called ``name``, or a StudyError listing the known ones."""
    if name not in TASKS:
        raise StudyError(f"task: expected one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name]


def write_task_folder(task: str, data_dir: str | Path, dest: Path) -> Path:
    """Copy the packaged task YAML into ``dest`` with absolute data paths; returns ``dest``."""
    spec = task_spec(task)
    if spec.yaml_file is None:
        raise StudyError(f"task {task!r}: lm-eval's own task, there is no offline copy to write")
    data_dir = Path(data_dir).resolve()
    files = {split: data_dir / f"{split}.jsonl" for split in spec.splits}
    for split, path in files.items():
        if not path.is_file():
            raise StudyError(
                f"{path}: the {task} {split} split is missing (write it with {spec.data_hint or 'the data command'})"
            )
    source = TASK_DIR / spec.yaml_file
    config = yaml.safe_load(source.read_text(encoding="utf-8"))
    config["dataset_kwargs"]["data_files"] = {k: str(v) for k, v in files.items()}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / spec.yaml_file).write_text(
        f"# Written by kvstudy.accuracy.task_specs from src/kvstudy/accuracy/tasks/{spec.yaml_file}\n"
        + yaml.safe_dump(config, sort_keys=False),
        encoding="utf-8",
    )
    return dest
