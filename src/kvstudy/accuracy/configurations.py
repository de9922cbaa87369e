"""The study's accuracy configurations (what each one's server runs and how its eval is asked) and
the lm-eval tasks the runner can ask (:data:`TASKS`, and how each one reads its data).

``CONFIGURATIONS`` names every configuration a capture folder may hold (its sub-folder names);
configurations that share a ``server_key`` share one server start. ``server_config_for`` is the
baseline ``ServerConfig`` with only a configuration's intended changes.

lm-eval's own long-context tasks (``ruler``, ``niah_single_1`` ...) are not wired in: they build
their haystacks at load time with the served model's tokenizer, download NLTK data and essays from
the hub, and their samples carry no context id to cluster on; ``retrieval_offline`` reads local
JSONL written by ``kvstudy retrieval-data`` instead. A task's ``defaults`` hold only the settings in
which it differs from :class:`kvstudy.accuracy.runner.EvalSettings`' own (GSM8K's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kvstudy.errors import StudyError
from kvstudy.tools.tiny_model import DEFAULT_PATH as TINY_MODEL_PATH


@dataclass(frozen=True)
class EvalConfig:
    """One configuration of the study: what the server runs and how the eval is asked."""

    name: str  # folder name, e.g. "fp8-kv"
    label: str  # table label, e.g. "FP8 KV cache"
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype
    quantization: str | None = None  # --quantization (weights)
    num_fewshot: int | None = None  # None: the run's shots; 0 for a zero-shot weak baseline
    intended: tuple[str, ...] = ()  # fields allowed to differ from the baseline's record
    repeat: int = 0  # > 0: the same server settings started afresh (A/A control)
    # another model than the run's (only for a weak baseline of the discrimination check)
    model: str | None = None

    def server_key(self) -> tuple[str, str | None, int, str | None]:
        return (self.kv_cache_dtype, self.quantization, self.repeat, self.model)


CONFIGURATIONS: dict[str, EvalConfig] = {
    c.name: c
    for c in (
        EvalConfig("bf16", "BF16"),
        EvalConfig("fp8-weights", "FP8 weights", quantization="fp8", intended=("quantization",)),
        EvalConfig("fp8-kv", "FP8 KV cache", kv_cache_dtype="fp8", intended=("kv_cache_dtype",)),
        EvalConfig(
            "fp8-weights-fp8-kv",
            "FP8 weights + FP8 KV",
            kv_cache_dtype="fp8",
            quantization="fp8",
            intended=("kv_cache_dtype", "quantization"),
        ),
        EvalConfig("bf16-zero-shot", "BF16, zero-shot", num_fewshot=0),
        EvalConfig("bf16-repeat", "BF16, repeat", repeat=1),  # 16-bit vs 16-bit: the noise floor
        # A weak baseline for a model trained on the task's format, which answers zero-shot as well
        # as few-shot: the random-weight tiny model (`make tiny-model`), asked the same questions.
        EvalConfig("random-weights", "random weights (tiny model)", model=str(TINY_MODEL_PATH), intended=("model",)),
    )
}


def configurations(names: Sequence[str]) -> list[EvalConfig]:
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise StudyError(f"configurations: unknown {unknown}; expected some of {sorted(CONFIGURATIONS)}")
    return [CONFIGURATIONS[n] for n in names]


def server_config_for(cfg: EvalConfig, base: Any, fp8_kv_backend: str | None = None) -> Any:
    """The baseline ServerConfig with only this configuration's intended changes; ``fp8_kv_backend``
    sets the attention backend of the FP8-KV configurations only (the A/B guard reports it).
    """
    backend = fp8_kv_backend if fp8_kv_backend and cfg.kv_cache_dtype != "auto" else base.attention_backend
    model = cfg.model if cfg.model is not None else base.model
    return replace(
        base, model=model, kv_cache_dtype=cfg.kv_cache_dtype, quantization=cfg.quantization, attention_backend=backend
    )


# --------------------------------------------------------------------------- lm-eval tasks

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
        f"# Written by kvstudy.accuracy.configurations from src/kvstudy/accuracy/tasks/{spec.yaml_file}\n"
        + yaml.safe_dump(config, sort_keys=False),
        encoding="utf-8",
    )
    return dest
