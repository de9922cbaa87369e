"""Secrets out of everything the project writes: by name (``HF_TOKEN``, ``--api-key X``) and by value
(URL passwords, Authorization headers, token-shaped strings).

A ``{from_env: NAME}`` environment value is looked up only when a child's environment is built
(:func:`resolve_env`), so it is never part of a parameter, a manifest or a record. A child's output
is scrubbed line by line before it reaches its log (:func:`copy_scrubbed`). Report text and every
CSV (:func:`write_csv`) get the rule by shape alone (:func:`redact_shapes`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from kvstudy.errors import StudyError
from kvstudy.io import MAX_LOG_BYTES, read_text_checked, write_json_atomic, write_text_atomic

REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(
    r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|PWD|CREDENTIAL|AUTH|COOKIE|PRIVATE|SESSION|CERT|SIGNATURE", re.I
)
# Names that match SECRET_NAME but hold nothing secret (a count of tokens is not a token; "per token
# and head" is a KV scale's granularity, as in the arm ``int8-token-head``).
_HARMLESS_NAME = re.compile(
    r"TOKENS|TOKENIZER|TOKEN_?IDS?$|TOKEN_?(?:LEN|COUNT)|TOKEN_?HEADS?(?![A-Z])|KEY_?VALUE|KEY_?HEADS|KEY_?DIM|"
    r"SORT_?KEY|AUTHOR(?!I)|KV_?CACHE|^SESSIONS$",
    re.I,
)  # "sessions": a manifest's list of runs
# A token's shape, also inside a longer name: after any character but a letter or digit, so
# ``models/hf_...-model`` and ``run_hf_...`` are caught (``xhf_...`` is another word).
TOKEN_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|sk_(?:live|test)_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|"
    r"github_pat_[A-Za-z0-9_]{8,}|xox[abpr]-[A-Za-z0-9\-]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|"
    r"glpat-[A-Za-z0-9_\-]{8,}|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+)"
)
# After ``_`` a plain lowercase word (``use_hf_transfer``) is a name, not a token.
_PLAIN_WORD = re.compile(r"[a-z_\-]{1,15}")
# A value that is a token by its prefix: ``safe_environment`` drops the whole variable.
SECRET_VALUE = re.compile(r"^(hf_|sk-|ghp_|gho_|github_pat_|xox[abp]-|AKIA)[A-Za-z0-9_\-]{8,}")
# ``scheme://user:password@host``: the password runs to the authority's last ``@`` (an unencoded
# ``@`` inside it is common), wherever the URL sits in a longer text or a longer URL.
URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<pw>[^\s/?#'\"]+)(?=@[^\s@/?#'\"]*(?:[/?#\s'\")\]]|$))"
)
# ``?password=...`` / ``&token=...`` in a URL's query: the value runs to the next ``&``.
QUERY_SECRET = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z_][A-Za-z0-9_\-.]*)=)(?P<value>[^&#\s'\"]+)")
AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:Proxy-)?Authorization\s*[:=]\s*(?:(?:Bearer|Basic|Token)\s+)?)"
    r"(?P<value>[^\s'\",]+)",
    re.I,
)


def is_secret_name(name: str) -> bool:
    """Whether a variable, field or option name (any spelling) names a secret."""
    bare = str(name).lstrip("-").replace("-", "_")
    return bool(SECRET_NAME.search(bare)) and not _HARMLESS_NAME.search(bare)


def _token(match: re.Match[str]) -> str:
    """A token-shaped match redacted, unless it follows ``_`` and its body is a plain word."""
    start = match.start()
    if start and match.string[start - 1] == "_":
        body = re.sub(r"^(?:hf_|sk-|sk_(?:live|test)_|gh[pousr]_|github_pat_|xox[abpr]-|glpat-)", "", match.group(0))
        if _PLAIN_WORD.fullmatch(body):
            return match.group(0)
    return REDACTED


def redact_shapes(text: str) -> str:
    """``text`` with the secrets known by their shape replaced: URL passwords (also inside a longer
    URL), secret query parameters, Authorization headers and token-shaped strings (also inside a
    folder name). Report text (code, tables, style sheets) gets this, not the ``NAME=value`` rule,
    which would take ``key=lambda ...`` or ``--jp-private-height: 28px`` for secrets."""
    text = URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    text = QUERY_SECRET.sub(
        lambda m: m.group("head") + REDACTED if is_secret_name(m.group("name")) else m.group(0), text
    )
    text = AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    return TOKEN_VALUE.sub(_token, text)


def write_csv(frame: Any, directory: str | Path, name: str | None = None) -> Path:
    """Write a table (a pandas DataFrame) as ``<directory>/<name>.csv``, or at exactly ``directory``
    when no ``name`` (``kvstudy capacity --csv PATH``), atomically, every secret shape in it redacted
    (:func:`redact_shapes`: a token inside a folder name, a URL password); the path. The one
    writer of every CSV the study leaves beside its figures."""
    path = Path(directory) / f"{name}.csv" if name else Path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    named_index = any(n is not None for n in getattr(getattr(frame, "index", None), "names", []) or [])
    write_text_atomic(path, redact_shapes(frame.to_csv(index=named_index)))  # an index with a name is data
    return path


# NAME=value, NAME: value, --name value, --name=value, where NAME names a secret.
_ASSIGN = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_\-])(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_\-.]*)['\"]?"
    r"\s*(?:=|:\s*|\s+(?=\S)))(?P<q>\[?['\"]?)(?P<value>[^\s'\",}<]+)"
)


def redact_text(text: str) -> str:
    """``text`` with secret values replaced: URL passwords, Authorization headers, token-shaped
    strings, and the values of ``NAME=value`` / ``--name value`` pairs whose name is a secret."""
    text = redact_shapes(text)

    def assign(match: re.Match[str]) -> str:
        name = match.group("name")
        if REDACTED[1:] in match.group(0):  # already redacted by value
            return match.group(0)
        flag_or_assign = name.startswith("-") or not match.group("head")[len(name) :].isspace()
        if flag_or_assign and is_secret_name(name):
            return match.group("head") + match.group("q") + REDACTED
        return match.group(0)

    return _ASSIGN.sub(assign, text)


def redact(value: Any) -> Any:
    """A copy of ``value`` (mapping, list, tuple, string, other scalars) with secrets redacted.

    A list or tuple is an argument list: whatever follows a secret-naming option (``--api-key X``)
    is its value, even if it looks like a flag. A mapping key that names a secret has its whole value
    redacted, whatever its type, but for a ``{from_env: NAME}`` reference (it holds no secret)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (
                (dict(v) if is_env_reference(v) else REDACTED if v not in (None, "") else v)
                if isinstance(k, str) and is_secret_name(k)
                else redact(v)
            )
            for k, v in value.items()
        }
    if not isinstance(value, (list, tuple)):
        return value
    items: list[Any] = []
    for arg in value:
        prev = items[-1] if items else None
        after_secret = isinstance(prev, str) and prev.startswith("-") and "=" not in prev and is_secret_name(prev)
        items.append(REDACTED if after_secret else redact(arg))
    return tuple(items) if isinstance(value, tuple) else items


def is_env_reference(value: Any) -> bool:
    """Whether ``value`` is ``{"from_env": "NAME"}``."""
    return (
        isinstance(value, Mapping)
        and set(value) == {"from_env"}
        and isinstance(value["from_env"], str)
        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value["from_env"]) is not None
    )


def check_env_mapping(env: Any, where: str) -> dict[str, Any]:
    """``env`` checked to map variable names to strings or ``{from_env: NAME}``; StudyError otherwise."""
    if not isinstance(env, Mapping):
        raise StudyError(
            f"{where}: expected a mapping of variable names to strings or {{from_env: NAME}}, got {type(env).__name__}"
        )
    for key, value in env.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise StudyError(f"{where}: {str(key)[:40]!r} is not an environment variable name")
        if not isinstance(value, str) and not is_env_reference(value):
            raise StudyError(f"{where}.{key}: expected a string or {{from_env: NAME}}, got {type(value).__name__}")
        if isinstance(value, str) and "\x00" in value:
            raise StudyError(f"{where}.{key}: holds a NUL character")
    return dict(env)


def resolve_env(env: Mapping[str, Any], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` with every ``{from_env: NAME}`` replaced by ``source[NAME]`` (the parent environment);
    a reference to a variable that is not set is a StudyError naming it (never its value).
    Call this only where the child's environment is built."""
    source = os.environ if source is None else source
    out: dict[str, str] = {}
    for key, value in env.items():
        if is_env_reference(value):
            name = value["from_env"]
            if name not in source:
                raise StudyError(f"env {key}: from_env {name}: not set in this environment")
            out[key] = source[name]
        else:
            out[key] = str(value)
    return out


def secret_values(env: Mapping[str, Any] | None = None) -> list[str]:
    """The values of secret-named variables in ``env`` (default: this process's environment), for a
    last scrub of copied text: a planted value never survives even where its shape is unknown."""
    env = os.environ if env is None else env
    return sorted(
        {v for k, v in env.items() if isinstance(v, str) and len(v) >= 6 and is_secret_name(k)}, key=len, reverse=True
    )


def scrub(text: str, values: list[str] | None = None) -> str:
    """``redact_text(text)`` and then every literal secret value of ``values`` (default: the secret
    environment of this process) replaced."""
    return scrub_report(redact_text(text), values)


def scrub_file(path: Path, values: list[str] | None = None, limit: int = MAX_LOG_BYTES) -> None:
    """Rewrite the text file ``path`` scrubbed (``scrub``) of ``values``: the second net behind a
    scrubbed copy (``copy_scrubbed``). A missing or unreadable file, or one over ``limit`` bytes, is
    left as it is."""
    try:
        text = read_text_checked(path, limit, errors="replace")
    except StudyError:
        return
    clean = scrub(text, values)
    if clean != text:
        write_text_atomic(path, clean)


def scrub_report(text: str, values: list[str] | None = None) -> str:
    """Report text (a notebook's cells, HTML, the index, a CSV) without secrets: ``redact_shapes``,
    then every literal value of ``values`` (default: this process's secret environment)."""
    text = redact_shapes(text)
    for value in secret_values() if values is None else values:
        text = text.replace(value, REDACTED)
    return text


def scrub_tree(value: Any, values: list[str], skip_keys: frozenset[str] = frozenset()) -> Any:
    """A copy of parsed JSON ``value`` with every string ``scrub_report``-ed (each string on its own,
    so no JSON escape is cut); the values of ``skip_keys`` (image data) are kept as they are."""
    if isinstance(value, str):
        return scrub_report(value, values)
    if isinstance(value, dict):
        return {k: v if k in skip_keys else scrub_tree(v, values, skip_keys) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_tree(v, values, skip_keys) for v in value]
    return value


def write_scrubbed(path: str | Path, text: str, values: list[str] | None = None) -> None:
    """The one writer of report text (index, HTML, CSV): ``scrub_report(text, values)`` (and this
    process's secret environment) written atomically: no secret by shape or literal value reaches it."""
    write_text_atomic(path, scrub_report(text, [*(values or []), *secret_values()]))


def write_json_scrubbed(path: str | Path, data: Any, values: list[str] | None = None) -> None:
    """The one writer of report JSON (``status.json``): every string scrubbed on its own
    (``scrub_tree``, so no JSON escape is cut), then written atomically."""
    write_json_atomic(path, scrub_tree(data, [*(values or []), *secret_values()]), indent=1)


def safe_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without anything that looks like a secret (by name or by value), for records;
    values that carry a secret inside (a password in a URL) are kept redacted."""
    return {
        k: redact(str(v)) for k, v in sorted(env.items()) if not is_secret_name(k) and not SECRET_VALUE.match(str(v))
    }


def literal_secrets(env: Mapping[str, Any], args: Sequence[Any] = ()) -> list[str]:
    """Literal secret values an environment mapping and an argument list carry, longest first:
    secret-named values, the values ``{from_env: NAME}`` references have in this process's
    environment, and values after (or ``=``-joined to) secret-named options; so copied text can be
    scrubbed of them even where their shape is unknown."""
    values: list[str] = []
    for key, value in env.items():
        if is_env_reference(value):
            values.append(os.environ.get(value["from_env"], ""))
        elif is_secret_name(key):
            values.append(str(value))
    words = [str(a) for a in args]
    for i, arg in enumerate(words):
        if arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            values.append(arg.split("=", 1)[1] if "=" in arg else (words[i + 1] if i + 1 < len(words) else ""))
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


# ---- a child's output to a log file, scrubbed line by line ------------------------------------
SCRUB_READ_BYTES = 65536
SCRUB_PIECE_BYTES = 1 << 20  # a longer line is scrubbed and written in pieces
_SPACES = b" \t\x0b\x0c"
_AFTER_LAST_SPACE = re.compile(rb"(?s).*[ \t\x0b\x0c]")  # greedy: match.end() is after the last space
_AFTER_LAST_NON_TOKEN = re.compile(rb"(?s).*[^A-Za-z0-9_\-.]")


def _cut_point(data: bytes, limit: int) -> int:
    """Where to cut a line longer than ``limit`` bytes: before the last two words of its first
    ``limit`` bytes (so ``--api-key VALUE`` stays in one piece), else after its last byte outside a
    token's alphabet, else at ``limit``; never before ``limit // 2`` (each piece makes progress)."""
    window = data[:limit]
    least = max(1, limit // 2)
    last = _AFTER_LAST_SPACE.match(window)
    if last:
        before = _AFTER_LAST_SPACE.match(window[: last.end()].rstrip(_SPACES))
        for cut in (before.end() if before else 0, last.end()):
            if cut >= least:
                return cut
    other = _AFTER_LAST_NON_TOKEN.match(window)
    return other.end() if other and other.end() >= least else limit


def _ready_part(pending: bytes, limit: int) -> tuple[bytes, bytes]:
    """(what can be written now: complete lines and pieces of over-long lines, what waits for more)."""
    end = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
    ready, rest = pending[:end], pending[end:]
    pieces = [ready] if ready else []
    while len(rest) > limit:
        cut = _cut_point(rest, limit)
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return b"".join(pieces), rest


def _write_scrubbed(target: IO[bytes], data: bytes, values: list[str]) -> bool:
    """Write ``data`` scrubbed and flush; False when ``target`` cannot be written any more."""
    try:  # bytes that are not UTF-8 pass through unchanged (surrogateescape)
        clean = scrub(data.decode("utf-8", "surrogateescape"), values).encode("utf-8", "surrogateescape")
    except Exception:  # never let one odd line stop the copy: the child would block on a full pipe
        clean = f"{REDACTED} ({len(data)} bytes of output that could not be scrubbed left out)\n".encode()
    try:
        target.write(clean)
        target.flush()
    except (OSError, ValueError):
        return False
    return True


def copy_scrubbed(
    source: IO[bytes], target: IO[bytes], values: list[str], piece_bytes: int = SCRUB_PIECE_BYTES
) -> None:
    """Copy ``source`` (a child's output pipe) to ``target`` until end of file, each line (``\\n`` or
    ``\\r`` ended; a last line without one at the end) scrubbed of ``values`` and of every secret shape
    (``scrub``) before it is written and flushed. A line longer than ``piece_bytes`` is written in
    pieces cut between words where it can. Reading goes on to end of file even when ``target`` fails
    (the child never blocks on a full pipe); both files are closed at the end."""
    fd = source.fileno()
    pending = b""
    writable = True
    try:
        while True:
            try:
                chunk = os.read(fd, SCRUB_READ_BYTES)
            except OSError:
                chunk = b""
            pending += chunk
            ready, pending = _ready_part(pending, piece_bytes) if chunk else (pending, b"")
            if ready and writable:
                writable = _write_scrubbed(target, ready, values)
            if not chunk:
                return
    finally:
        for handle in (source, target):
            try:
                handle.close()
            except OSError:
                pass


def start_scrubbed_copy(
    source: IO[bytes], target: IO[bytes], values: list[str], name: str = "kvstudy-scrubbed-copy"
) -> threading.Thread:
    """``copy_scrubbed`` in a daemon thread (it never keeps the interpreter alive); join it after the
    child has exited to have the whole output in ``target``."""
    thread = threading.Thread(target=copy_scrubbed, args=(source, target, list(values)), name=name, daemon=True)
    thread.start()
    return thread
