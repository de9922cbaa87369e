"""Files in and out: atomic writes, checked JSON and JSON-lines reads, log tails, digests.

Writes go through a temporary file beside the target, then ``os.replace``: a reader (or a resumed
run) sees either the old file or the complete new one, never a torn write. Every read failure is a
one-line ``StudyError`` naming the file (and the line, for JSON lines).
"""

from __future__ import annotations

import codecs
import dataclasses
import errno
import hashlib
import json
import math
import os
import re
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kvstudy.errors import StudyError

T = TypeVar("T")
N = TypeVar("N", int, float)
# The repository's root folder: relative paths in parameters, profiles and records start here.
REPO_ROOT = Path(__file__).resolve().parents[2]


def check_write_target(path: str | Path) -> Path:
    """``path`` if a writer may put a file there: not a symlink (a planted link would carry the
    write out of its folder) and not a folder; a StudyError otherwise."""
    path = Path(path)
    if path.is_symlink():
        raise StudyError(f"{path}: is a symlink; refusing to write through it (expected a file or nothing there)")
    if path.is_dir():
        raise StudyError(f"{path}: is a folder (expected a file or nothing there)")
    return path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a flushed temporary file in the same folder (never through
    a symlink at ``path``: :func:`check_write_target`)."""
    path = check_write_target(path)
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


def shorten_words(text: str, width: int) -> str:
    """``text`` on one line; when longer than ``width``, cut at a word boundary (never mid-word)
    and ended with " …"."""
    flat = " ".join(str(text).split())
    if len(flat) <= width:
        return flat
    cut = flat[: max(1, width - 2)]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return head.rstrip(" ,;:") + " …"


def json_default(value: Any) -> Any:
    """Paths as text, records through ``to_dict`` or as dataclass fields; anything else is an error."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json_atomic(
    path: str | Path,
    data: Any,
    *,
    indent: int = 2,
    allow_nan: bool = False,
    default: Callable[[Any], Any] = json_default,
) -> None:
    """Write ``data`` as indented JSON; NaN is refused unless ``allow_nan``."""
    text = json.dumps(data, indent=indent, default=default, allow_nan=allow_nan)
    write_text_atomic(path, text + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> None:
    """Write one JSON object per line (dataclass records are written field by field)."""
    write_text_atomic(path, "".join(json.dumps(row, default=json_default, ensure_ascii=False) + "\n" for row in rows))


def parse_jsonl_text(
    text: str, where: str | Path, make: Callable[[Any], T] = lambda row: row, what: str = "a JSON object"
) -> list[T]:
    """Each non-blank line of JSON-lines text through ``make``; a line that does not parse, or that
    ``make`` rejects (TypeError, ValueError, StudyError), is one StudyError ``where:N: ...``. Lines end
    at "\n" only: U+2028 and the like may sit unescaped inside a JSON string."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        check_nesting(line, f"{where}:{number}")
        try:
            rows.append(make(json.loads(line)))
        except (ValueError, TypeError, RecursionError, StudyError) as exc:  # RecursionError: a > 4300-digit int
            raise StudyError(f"{where}:{number}: not {what} ({exc})") from None
    return rows


def read_jsonl(path: str | Path, make: Callable[[Any], T] = lambda row: row, what: str = "a JSON object") -> list[T]:
    """:func:`parse_jsonl_text` of a file."""
    return parse_jsonl_text(read_text_checked(path, MAX_LOG_BYTES), path, make, what)


# --------------------------------------------------------------------------- JSON files


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is not a bool, NaN, infinite or beyond a float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


# --------------------------------------------------------------------------- logs

TAIL_BYTES = 1024 * 1024
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour and cursor sequences (vLLM colours its log under a kernel)."""
    return ANSI.sub("", text)


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, colours stripped ('' when there is no file)."""
    try:
        target = check_regular_file(path)
        with open(target, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except (OSError, StudyError):
        return ""
    return text_tail(text, lines)


def text_tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text``, colours stripped."""
    return "\n".join(strip_ansi(text).splitlines()[-lines:])


# --------------------------------------------------------------------------- checked reading layer
#
# Every input the project reads from a user (configs, indexes, specs, profiles, logs, headers)
# goes through these: regular files only (no FIFO, device or directory; symlinks resolved and the
# target checked), a size limit, a nesting limit checked before parsing (no RecursionError), and
# typed field access whose errors name the file and the field path.

MAX_INPUT_BYTES = 64 * 1024 * 1024  # a config, index, spec or profile is far below this
MAX_LOG_BYTES = 256 * 1024 * 1024  # a server log is read from its tail when larger
MAX_NESTING = 64  # no real config nests deeper than a handful of levels
MAX_NODES = 2_000_000  # YAML aliases can make a small file a huge tree
MAX_NUMBER_DIGITS = 30  # a count or size in a log or config never needs more
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)


def check_regular_file(path: str | Path) -> Path:
    """The resolved path of ``path`` if it is a regular file (after symlinks), else a StudyError."""
    path = Path(path)
    try:
        target = path.resolve(strict=True)
        st = target.stat()
    except FileNotFoundError:
        raise StudyError(f"{path}: file not found") from None
    except RuntimeError:
        raise StudyError(f"{path}: symlink loop (expected a file)") from None
    except OSError as exc:
        reason = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise StudyError(f"{path}: cannot open ({reason})") from None
    if stat.S_ISDIR(st.st_mode):
        raise StudyError(f"{path}: is a directory (expected a file)")
    if not stat.S_ISREG(st.st_mode):
        raise StudyError(f"{path}: not a regular file (a FIFO, device or socket; expected a file)")
    return target


def read_bytes_checked(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file no larger than ``limit``; never blocks on a FIFO."""
    try:
        fd = os.open(check_regular_file(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StudyError(f"{path}: cannot open ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):  # swapped after the check
            raise StudyError(f"{path}: not a regular file (expected a file)")
        if st.st_size > limit:
            raise StudyError(f"{path}: {st.st_size} bytes is larger than the {limit}-byte limit for this input")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise StudyError(f"{path}: larger than the {limit}-byte limit for this input")
    return data


def decode_text(data: bytes, where: str | Path, errors: str = "strict", bom: bool = False) -> str:
    """``data`` as UTF-8 text, or with ``bom`` in the encoding its byte-order mark names (the mark
    dropped; Windows tools write them: PowerShell 5.1's ``>`` and ``Out-File`` save UTF-16 LE with
    one); text not in that encoding is a StudyError (``errors='replace'`` keeps going, for logs)."""
    encoding = "utf-8"
    if bom:  # UTF-32 LE's mark begins with UTF-16 LE's
        encoding = "utf-8-sig"
        if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
            encoding = "utf-32"
        elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            encoding = "utf-16"
    try:
        return data.decode(encoding, errors=errors)
    except UnicodeDecodeError as exc:
        raise StudyError(f"{where}: not {encoding.upper()} text (byte {exc.start})") from None


def read_text_checked(path: str | Path, limit: int = MAX_INPUT_BYTES, errors: str = "strict", bom: bool = False) -> str:
    """A regular file's text as UTF-8 (``errors='replace'`` for logs; ``bom``: a byte-order mark
    names the encoding, as in a log saved by PowerShell); other bytes are a StudyError."""
    return decode_text(read_bytes_checked(path, limit), path, errors, bom)


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def check_nesting(text: str, where: str, limit: int = MAX_NESTING) -> None:
    """A StudyError if JSON (or YAML flow) ``text`` nests brackets deeper than ``limit``."""
    if text.count("[") + text.count("{") <= limit:
        return
    depth = 0
    for match in _BRACKETS.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if match.group() in "[{" else -1
        if depth > limit:
            raise StudyError(f"{where}: nested deeper than {limit} levels (expected a plain JSON document)")


def check_tree(data: Any, where: str, limit: int = MAX_NESTING, max_nodes: int = MAX_NODES) -> None:
    """A StudyError if parsed ``data`` nests deeper than ``limit`` or has more than ``max_nodes``
    nodes (counted with repeats, so YAML alias bombs stop here); iterative, no recursion."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise StudyError(f"{where}: more than {max_nodes} values (expected a small document)")
        if depth > limit:
            raise StudyError(f"{where}: nested deeper than {limit} levels (expected a plain document)")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            stack.extend((k, depth + 1) for k in item if not isinstance(k, str))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


@dataclasses.dataclass(frozen=True)
class _BadNumber:
    """A number a ``finite`` read refuses, kept in place so the error can name its field."""

    text: str


MAX_FLOAT_TEXT = 40  # a float Python writes is at most ~24 characters (17 digits, sign, exponent)


def _strict_int(text: str) -> Any:
    return int(text) if len(text.lstrip("-")) <= MAX_NUMBER_DIGITS else _BadNumber(text)


def _strict_float(text: str) -> Any:
    value = float(text)
    return value if len(text) <= MAX_FLOAT_TEXT and math.isfinite(value) else _BadNumber(text)


def leaves(data: Any) -> Iterator[tuple[Any, str]]:
    """Every value of a parsed JSON tree that is not a mapping or a list, with its path (``a.b[2]``)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
        else:
            yield item, at


def parse_json_text(text: str | bytes, where: str, *, finite: bool = False) -> Any:
    """Parse JSON ``text`` with the nesting check; every failure is a StudyError naming ``where``.

    ``finite``: for files the project writes itself (plans, block records), where NaN, Infinity, a
    float that overflows or a number of more than ``MAX_NUMBER_DIGITS`` digits can only be
    tampering; the error names the field. (Off by default: real Hub configs hold ``Infinity``.)"""
    if isinstance(text, bytes):
        text = decode_text(text, where)
    check_nesting(text, where)
    hooks: dict[str, Any] = (
        {"parse_int": _strict_int, "parse_float": _strict_float, "parse_constant": _BadNumber} if finite else {}
    )
    try:
        data = json.loads(text, **hooks)
    except json.JSONDecodeError as exc:
        raise StudyError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise StudyError(f"{where}: malformed JSON ({str(exc)[:120]})") from None
    for item, at in leaves(data) if finite else ():  # the first field (``a.b[2]``) holding a refused number
        if isinstance(item, _BadNumber):
            text = item.text if len(item.text) <= 20 else f"a number of {len(item.text)} characters"
            raise StudyError(
                f"{where}: field {at or '(top level)'}: {text} is not a number this file holds "
                f"(expected a finite number of at most {MAX_NUMBER_DIGITS} digits)"
            )
    return data


def read_json(path: str | Path, limit: int = MAX_INPUT_BYTES, *, finite: bool = False) -> Any:
    """Parse a regular JSON file within the size and nesting limits; failures are one-line StudyErrors
    (``finite``: see :func:`parse_json_text`)."""
    return parse_json_text(read_text_checked(path, limit), str(path), finite=finite)


def read_json_object(path: str | Path, limit: int = MAX_INPUT_BYTES, *, finite: bool = False) -> dict[str, Any]:
    """``read_json`` that also insists on a JSON object at the top level."""
    data = read_json(path, limit, finite=finite)
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping giving one key twice (safe_load keeps the last and
    drops the first without a word), naming the key and its line."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: construct_mapping names it
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {str(key)[:60]!r} is given twice (expected each key once)", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> Any:
    """Parse a regular YAML file with ``yaml.safe_load``'s rules within the size, nesting and
    size-of-tree limits, refusing a key given twice in one mapping; failures are one-line StudyErrors."""
    text = read_text_checked(path)
    check_nesting(text, str(path))
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise StudyError(f"{path}: malformed YAML{at} ({problem})") from None
    except (RecursionError, ValueError) as exc:
        raise StudyError(f"{path}: malformed YAML ({str(exc)[:120]})") from None
    check_tree(data, str(path))
    return data


# --------------------------------------------------------------------------- typed fields

_MISSING: Any = object()
_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def type_name(value: Any) -> str:
    """A user-facing name of ``value``'s JSON/YAML type."""
    return {**_TYPE_NAMES, bool: "a boolean"}.get(type(value), type(value).__name__)


def get_field(data: Any, field_path: str, kind: type | tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """``data[a][b]...`` for ``field_path`` 'a.b...', checked to be of ``kind``.

    A missing field gives ``default`` (or a StudyError when there is none); a field of another
    type is a StudyError naming ``where`` and the field path. bool never passes for int/float, and
    an int passes for float.
    """
    value = data
    for part in field_path.split("."):
        if not isinstance(value, dict) or part not in value:
            if default is not _MISSING:
                return default
            raise StudyError(f"{where}: {field_path}: missing (required)")
        value = value[part]
    asked = kind if isinstance(kind, tuple) else (kind,)
    kinds = (*asked, int) if float in asked else asked
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = {**_TYPE_NAMES, bool: "true/false"}
        expected = " or ".join(names.get(k, k.__name__) for k in asked)
        raise StudyError(f"{where}: {field_path}: expected {expected}, got {type_name(value)} {short_repr(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise StudyError(f"{where}: {field_path}: expected a finite number, got {value!r}")
    return value


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (huge values stay on one short line)."""
    try:
        text = repr(value)
    except ValueError:  # an int too large to print
        return "(a huge number)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bounded_int(value: Any, where: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` (an int, or digits in text with optional thousands commas) as an int within
    [low, high]; anything else, or more than ``MAX_NUMBER_DIGITS`` digits, is a StudyError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and _INT_TEXT.fullmatch(text := value.strip().replace(",", "").replace("_", "")):
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value.bit_length() > 4 * MAX_NUMBER_DIGITS:
        raise StudyError(f"{where}: expected an integer, got {short_repr(value)}")
    return _check_range(value, where, low, high)


def bounded_float(value: Any, where: str, low: float | None = None, high: float | None = None) -> float:
    """``value`` (a number, or decimal text with optional thousands commas) as a finite float
    within [low, high]; NaN, infinities, huge digit strings and other types are StudyErrors."""
    if isinstance(value, str) and _FLOAT_TEXT.fullmatch(text := value.strip().replace(",", "")):
        value = float(text)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 1000:
        value = float(value)
    if not isinstance(value, float) or not math.isfinite(value):
        raise StudyError(f"{where}: expected a number, got {short_repr(value)}")
    return _check_range(value, where, low, high)


def _check_range(value: N, where: str, low: float | None, high: float | None) -> N:
    if low is not None and value < low:
        raise StudyError(f"{where}: {value!r} is below the minimum {low!r}")
    if high is not None and value > high:
        raise StudyError(f"{where}: {value!r} is above the maximum {high!r}")
    return value


def relocate_text(text: str, old: str | Path, new: str) -> str:
    """``text`` with the folder ``old`` written ``new``: ``old/x`` becomes ``new/x`` (``x`` where
    ``new`` is ``.``) and a bare ``old`` ``new``; ``old2``, ``a/old`` and ``old.x`` are left alone."""
    old = str(old).rstrip("/")
    if not old:
        return text
    pattern = re.compile(
        r"(?<![A-Za-z0-9_.\-/])" + re.escape(old) + r"(?:/(?=[^/\s])|(?![A-Za-z0-9_\-]|\.[A-Za-z0-9_\-]))"
    )
    return pattern.sub(lambda m: f"{new}/".removeprefix("./") if m.group(0).endswith("/") else new, text)


def without_machine_paths(text: str, root: str | Path = REPO_ROOT) -> str:
    """``text`` without the rendering machine's own folders: the repository root made relative and
    the home folder written ``~``."""
    return relocate_text(relocate_text(text, root, "."), Path.home(), "~")


# --------------------------------------------------------------------------- digests: files read in chunks,
# weight files by their size and safetensors header, never their tensors

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
        files = sorted(
            (p for p in path.rglob("*") if p.is_file() and not p.is_symlink()), key=lambda p: str(p.relative_to(path))
        )
    else:
        files = [check_regular_file(path)]
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
