"""Files in and out: atomic writes, checked JSON and JSON-lines reads, digests, log tails.

Writes go through a temporary file beside the target, then ``os.replace``: a reader (or a resumed
run) sees either the old file or the complete new one, never a torn write. Every read failure is a
one-line ``StudyError`` naming the file (and the line, for JSON lines). Digests read files in
chunks; weight files contribute their size and safetensors header, never their tensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from kvstudy.errors import StudyError

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


# --------------------------------------------------------------------------- JSON files

def read_json(path: str | Path) -> Any:
    """Parse a JSON file, turning every failure into a one-line StudyError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StudyError(f"{path}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StudyError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is not a bool, NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------- logs

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour and cursor sequences (vLLM colours its log under a kernel)."""
    return ANSI.sub("", text)


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, colours stripped ('' when there is no file)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text_tail(text, lines)


def text_tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text``, colours stripped."""
    return "\n".join(strip_ansi(text).splitlines()[-lines:])


# --------------------------------------------------------------------------- digests

CHUNK_BYTES = 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _update_with_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)


def _update_with_weights(digest: Any, path: Path) -> None:
    """A weight file's size and, for safetensors, its header: enough to tell checkpoints apart."""
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    if path.suffix != ".safetensors" or size < 8:
        return
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        digest.update(fh.read(min(n, 64 * 1024 * 1024, size - 8)))


def file_digest(path: str | Path, weights_headers_only: bool = True) -> str:
    """Short sha256 of a file, or of a folder's regular files in name order, read in chunks.

    Weight files (``WEIGHT_SUFFIXES``) contribute their name, size and safetensors header unless
    ``weights_headers_only`` is False, so digesting a model folder never reads its tensors.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        files = sorted((p for p in path.rglob("*") if p.is_file() and not p.is_symlink()), key=lambda p: str(p.relative_to(path)))
    else:
        files = [path]
    try:
        for file in files:
            digest.update(file.name.encode())
            if weights_headers_only and file.suffix in WEIGHT_SUFFIXES:
                _update_with_weights(digest, file)
            else:
                _update_with_file(digest, file)
    except (OSError, struct.error) as exc:
        raise StudyError(f"{path}: cannot digest ({exc})") from None
    return digest.hexdigest()[:12]


def weights_digest(files: Iterable[Path]) -> str | None:
    """A cheap identity of a set of weight files: names, sizes and safetensors headers (None if none)."""
    files = sorted(files)
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        try:
            _update_with_weights(digest, file)
        except (OSError, struct.error):
            continue
    return digest.hexdigest()[:12]
