"""Output folders a generator may write: its own (marked), a new or empty one, or any with ``--force``.

Every generator of the study's inputs (``checkpoints build``, ``retrieval-data``, ``gsm8k-data``,
``control-checkpoint``, ``train-model``) and the precision captures (``kv-simulate``,
``kv-screen``) claim their folder through :func:`claim_output_folder` before they write a
byte: a folder it did not create is refused unless ``--force``, a folder another generator marked
is refused always (one set's ``test.jsonl`` never overwrites another's), and a planted symlink
inside it is refused (no write follows a link out of its folder). Single files are guarded by
:func:`kvstudy.io.check_write_target`, which every atomic write calls.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import read_json_object, write_json_atomic

GENERATED_MARKER = ".kvstudy-generated.json"
# The marker of a model folder `kvstudy tiny-model build` made (its recipe and version).
TINY_MODEL_MARKER = ".kvstudy-tiny-model.json"


def generated_by_project(folder: str | Path) -> bool:
    """Whether ``folder`` is something this project generated: a tiny model it built, or a folder
    inside (or being) one a generator marked (``checkpoints build`` marks ``data/checkpoints``)."""
    folder = Path(folder)
    if (folder / TINY_MODEL_MARKER).is_file():
        return True
    return any(_marker_generator(f) is not None for f in (folder, folder.parent))


def _marker_generator(folder: Path) -> str | None:
    """Which generator's marker ``folder`` holds (None when it holds none or an unreadable one)."""
    marker = folder / GENERATED_MARKER
    if not marker.is_file() or marker.is_symlink():
        return None
    try:
        data = read_json_object(marker)
    except StudyError:
        return None
    name = data.get("generator")
    return name if isinstance(name, str) else None


def record_says(file: str, key: str, accept: Callable[[Any], bool]) -> Callable[[Path], bool]:
    """Whether a folder's JSON object ``file`` has a ``key`` that ``accept``s (False when unreadable):
    the ``recognise`` of a generator that wrote its folders before they were marked."""

    def recognise(folder: Path) -> bool:
        try:
            return accept(read_json_object(folder / file).get(key))
        except StudyError:
            return False

    return recognise


def links_out(folder: Path) -> Path | None:
    """The first symlink inside ``folder`` (at any depth, links not followed), or None."""
    return next((path for path in folder.rglob("*") if path.is_symlink()), None)


def check_output_folder(
    folder: str | Path, generator: str, force: bool = False, recognise: Callable[[Path], bool] | None = None
) -> Path:
    """The checks of :func:`claim_output_folder` alone, writing nothing: for a command that refuses a
    folder first and claims it only once its other input is checked."""
    folder = Path(folder)
    try:
        if folder.exists() and not folder.is_dir():
            raise StudyError(f"{folder}: exists and is not a folder (expected the output folder of {generator})")
        if not folder.is_dir():
            return folder
        owner = _marker_generator(folder)
        if owner is not None and owner != generator:
            raise StudyError(
                f"{folder}: holds the output of `kvstudy {owner}`; refusing to write `kvstudy {generator}` "
                "files over it (pick another folder)"
            )
        link = links_out(folder)
        if link is not None:
            raise StudyError(f"{link}: is a symlink; refusing to write through it (expected plain files in {folder})")
        ours = owner == generator or not any(folder.iterdir()) or (recognise is not None and recognise(folder))
    except OSError as exc:  # a name longer than the file system allows, a parent that is a file
        raise StudyError(f"{folder}: cannot be the output folder of {generator} ({exc.strerror or exc})") from None
    if not ours and not force:
        raise StudyError(
            f"{folder}: not empty and not written by `kvstudy {generator}` (no {GENERATED_MARKER}); "
            "refusing to replace its files: pick another folder, or pass --force"
        )
    return folder


def claim_output_folder(
    folder: str | Path, generator: str, force: bool = False, recognise: Callable[[Path], bool] | None = None
) -> Path:
    """Make ``folder`` the output of ``generator`` (a command name, e.g. ``retrieval-data``), or refuse
    in one line before anything is written (see the module docstring; ``recognise``: a folder it wrote
    before markers existed); the marker is written on success."""
    folder = check_output_folder(folder, generator, force, recognise)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(f"{folder}: cannot create the folder ({exc.strerror or exc})") from None
    write_json_atomic(folder / GENERATED_MARKER, {"generator": generator})
    return folder
