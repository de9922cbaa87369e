"""One arm of an A/B, the same for every experiment: a name, the KV dtype, and what else it sets.

The speed sweep calls its arms ``configurations`` and the context sweep ``arms`` (the notebooks'
parameter names); both hold :class:`Arm` records, read and checked by :func:`arm_from_dict` and
:func:`check_arms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import type_name
from kvstudy.vllm.arguments import check_server_env
from kvstudy.vllm.command import check_extra_args
from kvstudy.vllm.facts import CACHE_DTYPES


@dataclass
class Arm:
    """One KV arm: its name, the KV dtype, and the attention backend, environment and server flags
    it sets on top of what the whole grid sets."""

    name: str
    kv_cache_dtype: str = "auto"
    attention_backend: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)


def arm_from_dict(item: Any, where: str) -> Arm:
    """One arm mapping checked field by field (one line naming the field when it is wrong)."""
    if isinstance(item, Arm):
        return item
    if not isinstance(item, dict) or "name" not in item:
        raise StudyError(f"{where} must be a mapping with a 'name'")
    extra = sorted(set(item) - set(Arm.__dataclass_fields__), key=str)
    if extra:
        raise StudyError(f"{where} has unknown field(s) {[str(e)[:40] for e in extra]}")
    if not isinstance(item["name"], str):
        raise StudyError(f"{where}: 'name' must be a string, got {type_name(item['name'])}")
    if not isinstance(item.get("kv_cache_dtype", "auto"), str):
        raise StudyError(f"{where}: 'kv_cache_dtype' must be a string")
    if not isinstance(item.get("attention_backend") or "", str):
        raise StudyError(f"{where}: 'attention_backend' must be a string or null")
    args = item.get("extra_args", [])
    if not isinstance(args, (list, tuple)):
        raise StudyError(f"{where}: 'extra_args' must be a list of strings, got {type_name(args)}")
    check_server_env(item.get("env", {}), f"{where}: env")
    check_extra_args(list(args), f"{where}: extra_args")
    return Arm(**{**item, "extra_args": [str(a) for a in args], "env": dict(item.get("env") or {})})


def check_arms(arms: Sequence[Arm], where: str, what: str = "configuration") -> None:
    """Names present, distinct and file-safe; a KV dtype vLLM knows; environment and flags checked."""
    if not arms:
        raise StudyError(f"{where}: '{what}s' is empty (expected at least a 16-bit baseline and a candidate)")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise StudyError(f"{where}: {what} names repeat: {names}")
    for a in arms:
        if not a.name or not all(ch.isalnum() or ch in "-_." for ch in a.name):
            raise StudyError(f"{where}: {what} name {a.name!r} must be letters, digits, '-', '_' or '.'")
        if a.kv_cache_dtype not in CACHE_DTYPES:
            raise StudyError(
                f"{where}: {what} {a.name!r}: unknown kv_cache_dtype {a.kv_cache_dtype!r} "
                f"(expected one of {', '.join(CACHE_DTYPES)})"
            )
        check_server_env(a.env, f"{where}: {what} {a.name!r}: env")
        check_extra_args(a.extra_args, f"{where}: {what} {a.name!r}: extra_args")
