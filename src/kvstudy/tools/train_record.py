"""An earlier ``training.json`` read back to continue it (``train-model --continue-from``): its
recipe, the record fields the new one carries on, its files and their digests, and its model config,
each checked, so a tampered, linked or incomplete folder is one line naming what is wrong."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import is_finite_number, read_json_object, type_name
from kvstudy.tools.train_settings import TrainSettings, settings_from_dict


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


def _check_record(record: dict[str, Any], path: Path, steps: list[int]) -> None:
    """The fields of an earlier ``training.json`` that :func:`save_model` carries on, as it wrote them."""

    def entry(key: str, kind: type[list[Any]] | type[dict[str, Any]], length: int | None = None) -> Any:
        value: Any = record.get(key)
        if not isinstance(value, kind) or (length is not None and len(value) != length):
            what = f"a list of {length}" if length is not None else type_name(kind())
            raise StudyError(f"{path}: {key} is {type_name(value)}, expected {what} (the record train-model wrote)")
        return value

    if entry("steps", list, len(steps)) != steps:
        raise StudyError(f"{path}: steps is {record['steps']!r:.80}, expected {steps} (the recipe's phases)")
    points = entry("loss_curve", dict).get("points")
    if not isinstance(points, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(is_finite_number(x) for x in p) for p in points
    ):
        raise StudyError(
            f"{path}: loss_curve.points is not a list of [step, loss] pairs (the record train-model wrote)"
        )
    entry("final_part_losses", list, len(steps))
    entry("seconds_per_stage", list, len(steps))
    entry("first_losses", list)
    if not is_finite_number(record.get("wall_s", 0)):
        raise StudyError(f"{path}: wall_s is {type_name(record.get('wall_s'))}, expected seconds")
    files = entry("files", dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise StudyError(f"{path}: files is not a mapping of file name to sha256 (the record train-model wrote)")


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
