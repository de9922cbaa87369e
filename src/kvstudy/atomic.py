"""Capture files: atomic writes (a temporary file beside the target, then ``os.replace``) and
checked JSON-lines reads.

A reader (or a resumed run) sees either the old file or the complete new one, never a torn write;
a malformed line is reported with its file and line number.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .errors import StudyError

T = TypeVar("T")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a flushed temporary file in the same folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_default(value: Any) -> Any:
    """Paths as text, records through ``to_dict`` or as dataclass fields; anything else is an error."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json_atomic(path: str | Path, data: Any, *, indent: int = 2, allow_nan: bool = False,
                      default: Callable[[Any], Any] = json_default) -> None:
    """Write ``data`` as indented JSON; NaN is refused unless ``allow_nan``."""
    text = json.dumps(data, indent=indent, default=default, allow_nan=allow_nan)
    write_text_atomic(path, text + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> None:
    """Write one JSON object per line (dataclass records are written field by field)."""
    write_text_atomic(path, "".join(json.dumps(row, default=json_default, ensure_ascii=False) + "\n"
                                    for row in rows))


def read_jsonl(path: str | Path, make: Callable[[Any], T] = lambda row: row, what: str = "a JSON object",
               skip_blank: bool = True) -> list[T]:
    """Each line of a JSON-lines file through ``make``; a line that does not parse, or that ``make``
    rejects with TypeError/ValueError, is a StudyError naming the file and line (``make`` may raise
    its own StudyError)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if skip_blank and not line.strip():
            continue
        try:
            rows.append(make(json.loads(line)))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise StudyError(f"{path}:{number}: not {what} ({exc})") from None
    return rows
