"""The context sweep spec's fields checked for type and bound before a spec is built.

What ``ContextSweepSpec.from_dict`` runs first: every field of the mapping (a profile's parameters,
a spec file, a manifest) has the type it must have (a list of integers, not a string or booleans;
a number, not text) and stays within its bound (``kvstudy.limits``), each refusal one line naming
the field.
"""

from __future__ import annotations

from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import type_name
from kvstudy.limits import (
    MAX_ARMS,
    MAX_BLOCKS,
    MAX_BYTES,
    MAX_GIB,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_TOKENS,
    int_field,
    int_list,
    number_field,
)
from kvstudy.vllm.arguments import check_server_env

# Each integer field's least value and bound, and each number field's bound (kvstudy.limits).
_INT_FIELDS = {
    "output_len": (1, MAX_TOKENS),
    "prompts": (1, MAX_REQUESTS),
    "warmups": (0, MAX_REQUESTS),
    "kv_cache_memory_bytes": (1, MAX_BYTES),
    "num_gpu_blocks_override": (1, MAX_BLOCKS),
    "max_model_len": (1, MAX_TOKENS),
}
_NUMBER_FIELDS = {"cpu_kvcache_space_gib": MAX_GIB, "ready_timeout_s": MAX_SECONDS, "bench_timeout_s": MAX_SECONDS}
_OPTIONAL = ("cpu_kvcache_space_gib", "kv_cache_memory_bytes", "num_gpu_blocks_override", "max_model_len")


def check_types(data: dict[str, Any], where: str) -> None:
    """Every field of a spec mapping checked for type and bound before the spec is built (one line)."""
    if not isinstance(data["model"], str) or not data["model"] or len(data["model"]) > 4096:
        raise StudyError(
            f"{where}: 'model' must be a model folder or id (a non-empty string), got {type_name(data['model'])}"
        )
    if not isinstance(data["arms"], (list, tuple)):
        raise StudyError(f"{where}: 'arms' must be a list of mappings, got {type_name(data['arms'])}")
    if len(data["arms"]) > MAX_ARMS:
        raise StudyError(f"{where}: {len(data['arms'])} arms, expected at most {MAX_ARMS}")
    int_list(data["lengths"], f"{where}: 'lengths'", 1, MAX_TOKENS)
    if "seeds" in data:
        int_list(data["seeds"], f"{where}: 'seeds'", 0, MAX_SEED)
    for name, (low, high) in _INT_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            int_field(data[name], f"{where}: '{name}'", low, high)
    for name, top in _NUMBER_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            number_field(data[name], f"{where}: '{name}'", top)
    backend = data.get("attention_backend")
    if backend is not None and (not isinstance(backend, str) or not backend.replace("_", "").isalnum()):
        raise StudyError(f"{where}: 'attention_backend' must be a backend name (letters, digits, '_') or null")
    if "enforce_eager" in data and not isinstance(data["enforce_eager"], bool):
        raise StudyError(f"{where}: 'enforce_eager' must be true or false, got {type_name(data['enforce_eager'])}")
    env = data.get("server_env") or {}
    if isinstance(env, (list, tuple)):  # the frozen form: (name, value) pairs
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in env):
            raise StudyError(f"{where}: 'server_env' must be a mapping of variable names to values")
        env = dict(env)
    check_server_env(env, f"{where}: server_env")
