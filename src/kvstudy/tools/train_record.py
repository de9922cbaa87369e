"""An earlier ``training.json`` read back to continue it (``train-model --continue-from``): its
recipe, the record fields the new one carries on, its files and their digests, and its model config,
each checked, so a tampered, linked or incomplete folder is one line naming what is wrong."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from kvstudy.errors import StudyError
from kvstudy.io import read_json_object
from kvstudy.tools.train_settings import TrainSettings, first_error, settings_from_dict


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def folder_digests(folder: Path, skip: tuple[str, ...] = ("training.json", "SOURCE.md")) -> dict[str, str]:
    """sha256 of every file a model folder holds, but ``skip``."""
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name not in skip}


def earlier_record(folder: str | Path, settings: TrainSettings, config: dict[str, Any]) -> dict[str, Any]:
    """``training.json`` of a model folder that ``settings``' later phases may continue: its recipe is
    ``settings`` with only the first phases, its record holds what the new one carries on, its files
    are plain files matching their recorded digests, and its ``config.json`` is the recipe's model;
    else one line naming what was tampered with or is missing."""
    folder = Path(folder)
    path = folder / "training.json"
    if not path.is_file():
        raise StudyError(f"{folder}: no training.json (expected a model folder saved by train-model, to continue)")
    links = sorted(p.name for p in folder.iterdir() if p.is_symlink())
    if links:
        raise StudyError(f"{folder / links[0]}: a symbolic link; expected the file train-model saved, to continue")
    record = read_json_object(path)
    earlier = settings_from_dict(record.get("settings", {}))
    done = len(earlier.phases)
    same = earlier.phases == settings.phases[:done] and replace(earlier, phases=settings.phases) == settings
    if not same or done >= len(settings.phases):
        raise StudyError(
            f"{path}: its recipe is not this one's first {done} phase(s) "
            f"(expected a folder trained with the first phases of TrainSettings, to continue it)"
        )
    _check_record(record, path, [p.steps for p in earlier.phases])
    _check_files(folder, record["files"], path)
    _check_config(folder / "config.json", config)
    return record


Pair = Annotated[list[FiniteFloat], Field(min_length=2, max_length=2)]  # [step, loss]


class _Curve(BaseModel):
    points: list[Pair]


class _Record(BaseModel):
    """The fields of an earlier ``training.json`` that :func:`save_model` carries on, as it wrote them."""

    model_config = ConfigDict(strict=True)  # other fields are kept, not read

    steps: list[int]
    loss_curve: _Curve
    final_part_losses: list[dict[str, FiniteFloat]]
    seconds_per_stage: list[list[FiniteFloat]]
    first_losses: list[FiniteFloat]
    wall_s: FiniteFloat = 0.0
    files: dict[str, str]


def _check_record(record: dict[str, Any], path: Path, steps: list[int]) -> None:
    try:
        checked = _Record.model_validate(record)
    except ValidationError as exc:
        raise StudyError(f"{path}: {first_error(exc)} (the record train-model wrote)") from None
    if checked.steps != steps:
        raise StudyError(f"{path}: steps is {checked.steps!r:.80}, expected {steps} (the recipe's phases)")
    for key in ("final_part_losses", "seconds_per_stage"):
        if len(getattr(checked, key)) != len(steps):
            raise StudyError(
                f"{path}: {key} has {len(getattr(checked, key))} entries, expected {len(steps)} (one a phase)"
            )


def _check_files(folder: Path, recorded: dict[str, str], path: Path) -> None:
    """The folder's files are the ones ``training.json`` lists, with the same digests; else name one."""
    found = folder_digests(folder)
    for name in sorted(recorded):
        if name not in found:
            raise StudyError(
                f"{folder / name}: missing (training.json lists it; expected the saved model, to continue)"
            )
        if found[name] != recorded[name]:
            raise StudyError(
                f"{folder / name}: its content differs from the digest in training.json (changed since it was "
                f"saved; expected the saved model)"
            )
    extra = sorted(set(found) - set(recorded))
    if extra:
        raise StudyError(f"{folder / extra[0]}: not among the files {path.name} lists (expected the saved model only)")


def _check_config(path: Path, expected: dict[str, Any]) -> None:
    """``config.json`` describes the recipe's model ``expected`` (a folder whose digests were rewritten with it)."""
    saved = read_json_object(path)
    for key in (
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        if saved.get(key) != expected.get(key):
            raise StudyError(
                f"{path}: {key} is {str(saved.get(key))[:40]}, expected {expected.get(key)} (the recipe's model)"
            )
