"""The resolved-run record (one JSON object per server start) and the A/B guard.

A record keeps, side by side:

- ``asked``: the ServerConfig, the command line and the environment (secrets dropped);
- ``resolved``: what the startup log says vLLM did (``kvstudy.vllm.startup_log``), plus the block size
  and KV memory the pool was built from;
- ``model``: the model folder's KV-relevant settings (``kvstudy.model.scales.inspect_model``);
- ``capacity``: the pool ``kvstudy.model.capacity.predict_logged_pool`` predicts against the logged one;
- ``hardware`` and ``versions``.

``ab_guard(a, b)`` lists every difference between two records other than the intended one (the KV
dtype by default). Quantities derived from the KV dtype (the pool in tokens, the maximum
concurrency, the number of blocks) are compared only through the capacity prediction: they are
left out when both records gave the pool the same KV memory and each logged pool equals its own
prediction, because then the difference is exactly what the dtype change implies; otherwise they
are reported. The scale-1.0 warning is always compared: a run that used scale 1.0 is worth a line
even when the dtype explains it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstudy.capture import now_utc
from kvstudy.errors import StudyError
from kvstudy.formats import GIB
from kvstudy.io import file_digest, weights_digest
from kvstudy.machine import hardware_info, package_versions, vllm_distribution
from kvstudy.model.allocator import mamba_cache_mode_for, predict_logged_pool
from kvstudy.model.scales import inspect_model
from kvstudy.redact import redact
from kvstudy.vllm.command import ServerConfig, build_command, recorded_environment, server_environment, server_option
from kvstudy.vllm.facts import device_defaults
from kvstudy.vllm.startup_log import StartupInfo, parse_startup_log

if TYPE_CHECKING:
    from kvstudy.vllm.server import VllmServer

RECORD_VERSION = 1

# Fields the guard compares, by section.
RESOLVED_FIELDS = tuple(
    "version device attention_backend attention_candidates attention_backend_forced kv_cache_dtype "
    "kv_cache_dtype_config kv_scale_warning max_model_len quantization block_size kv_memory_bytes "
    "available_kv_memory_gib model_load_gib failed".split()
)
TOLERANCES = {"available_kv_memory_gib": 0.01, "model_load_gib": 0.02}  # relative; every other field exact
DERIVED_FIELDS = ("pool_tokens", "max_concurrency", "max_concurrency_len", "block_override")
MODEL_FIELDS = tuple(
    "config_sha256 weights_sha256 kv_cache_dtype_in_config quant_method kv_scheme kv_cache_quant_algo has_scales "
    "torch_dtype".split()
)
HARDWARE_FIELDS = ("device", "cpu_model", "gpus", "gpu_driver")


@dataclass(frozen=True)
class Difference:
    """One resolved difference between two records: ``field`` is dotted (``resolved.attention_backend``)."""

    field: str
    a: Any
    b: Any
    note: str = ""

    def __str__(self) -> str:
        extra = f" ({self.note})" if self.note else ""
        return f"{self.field}: {self.a!r} vs {self.b!r}{extra}"


def kv_memory(config: ServerConfig, info: StartupInfo) -> tuple[int | None, str]:
    """The KV memory the pool was built from, in bytes, and where that figure comes from."""
    if info.device == "cpu" and config.cpu_kvcache_space_gib is not None:
        return int(config.cpu_kvcache_space_gib * GIB), "VLLM_CPU_KVCACHE_SPACE (asked)"
    if info.device != "cpu" and config.kv_cache_memory_bytes is not None:
        return int(config.kv_cache_memory_bytes), "--kv-cache-memory-bytes (asked)"
    if info.available_kv_memory_gib is not None:
        return int(info.available_kv_memory_gib * GIB), "log (rounded to 0.01 GiB)"
    return None, "unknown"


def _capacity(
    config: ServerConfig,
    info: StartupInfo,
    model_folder: Path,
    block_size: int,
    memory: int | None,
    memory_source: str,
) -> dict[str, Any]:
    """Predicted vs logged pool; ``match`` is None when either side is missing."""
    out: dict[str, Any] = {
        "kv_memory_bytes": memory,
        "kv_memory_source": memory_source,
        "block_size": block_size,
        "logged": {
            "tokens": info.pool_tokens,
            "max_concurrency": info.max_concurrency,
            "max_model_len": info.max_concurrency_len,
        },
        "predicted": None,
        "match": None,
        "error": None,
    }
    max_len = info.max_model_len or info.max_concurrency_len or config.max_model_len
    override = info.block_override["override"] if info.block_override else config.num_gpu_blocks_override
    try:
        if memory is None and override is None:
            raise StudyError("no KV memory figure (neither asked nor logged)")
        if max_len is None:
            raise StudyError("no max_model_len in the log or the config")
        pool = predict_logged_pool(
            model_folder,
            info.kv_cache_dtype or config.kv_cache_dtype,
            int(memory or 1),
            int(max_len),
            block_size=block_size,
            num_blocks_override=override,
            device="cpu" if info.device == "cpu" else "cuda",
            mamba_cache_mode=mamba_cache_mode_for(config.extra_args),
        )
    except StudyError as exc:
        return {**out, "error": str(exc)}
    out["predicted"] = asdict(pool)
    if info.pool_tokens is not None:
        exact = memory_source.endswith("(asked)") or override is not None
        tolerance = 0 if exact else 0.01
        out["match"] = abs(pool.tokens - info.pool_tokens) <= tolerance * info.pool_tokens
        out["match_rule"] = "equal" if exact else "within 1% (memory read from the log is rounded)"
    return out


def _model_section(model_folder: Path, log_path: Path) -> dict[str, Any]:
    section: dict[str, Any] = {"folder": str(model_folder)}
    config, weights = model_folder / "config.json", sorted(model_folder.glob("*.safetensors"))
    section["config_sha256"] = file_digest(config) if config.is_file() else None
    section["weights_sha256"] = weights_digest(weights)
    try:  # with the log, its verdicts say whether the engine used the folder's scales
        report = inspect_model(model_folder, log=log_path)
    except StudyError:
        report = inspect_model(model_folder)
    section.update(report.to_dict())
    return section


def build_record(config: ServerConfig, log_path: Path, port: int | None = None) -> dict[str, Any]:
    """The resolved-run record of one server start, from its config and its log (JSON-ready)."""
    log_path = Path(log_path)
    if not log_path.is_file():
        raise StudyError(f"{log_path}: startup log not found (expected the log of a started server)")
    info = parse_startup_log(log_path)
    dist = vllm_distribution()
    version = dist[1] if dist else None
    model_folder = Path(config.model)
    given = server_option(config.extra_args, "--block-size")
    block = int(given) if given is not None else device_defaults(info.device)["block_size"]
    memory, memory_source = kv_memory(config, info)
    resolved = asdict(info)
    resolved.update(block_size=block, kv_memory_bytes=memory)
    return {
        "record_version": RECORD_VERSION,
        "created_utc": now_utc(),
        "log_path": str(log_path),
        "asked": {
            "config": config.to_dict(),
            "command": redact(build_command(config, port or 0, python="python", vllm_version=version)[1:]),
            "environment": recorded_environment(
                server_environment(config, vllm_version=version, resolve=False), config
            ),
            "port": port,
        },
        "resolved": resolved,
        "model": _model_section(model_folder, log_path) if model_folder.is_dir() else {"folder": config.model},
        "capacity": (
            _capacity(config, info, model_folder, block, memory, memory_source)
            if model_folder.is_dir()
            else {"error": "model is not a local folder"}
        ),
        "hardware": asdict(hardware_info()),
        "versions": package_versions(),
        "vllm_distribution": dist[0] if dist else None,
    }


def server_record(server: "VllmServer") -> dict[str, Any]:
    """The resolved-run record of a started server: its actual command, environment and port."""
    record = build_record(server.config, server.log_path, port=server.port)
    record["asked"]["command"] = redact(server.command[1:])  # without the interpreter's path
    record["asked"]["environment"] = server.environment
    record["server"] = {
        "base_url": server.base_url,
        "model_name": server.model_name,
        "pid": server.pid,
        "start_to_ready_s": None if server.ready_s is None else round(server.ready_s, 2),
    }
    return record


# --------------------------------------------------------------------------- A/B guard


def _intended(field: str, intended: Sequence[str]) -> bool:
    """``field`` is intended when named in full or by its last part (``X_config``, what the engine
    config line says about ``X``, counts as ``X``)."""
    last = field.rsplit(".", 1)[-1]
    return field in intended or last in intended or last.removesuffix("_config") in intended


def _differs(a: Any, b: Any, tolerance: float | None) -> bool:
    numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return not math.isclose(a, b, rel_tol=tolerance) if tolerance and numbers else a != b


def _section(record: dict[str, Any], name: str) -> dict[str, Any]:
    value = record.get(name)
    if not isinstance(value, dict):
        raise StudyError(f"record: missing the '{name}' section (expected a resolved-run record from build_record)")
    return value


def ab_guard(a: dict[str, Any], b: dict[str, Any], intended: Sequence[str] = ("kv_cache_dtype",)) -> list[Difference]:
    """Every resolved difference between records ``a`` and ``b`` besides the ``intended`` ones (a full
    dotted name such as ``resolved.version``, or its last part); empty when only those differ."""
    diffs: list[Difference] = []

    def compare(section: str, x: dict[str, Any], y: dict[str, Any], keys: Iterable[str], note: str = "") -> None:
        for key in keys:
            if _differs(x.get(key), y.get(key), TOLERANCES.get(key)) and not _intended(f"{section}.{key}", intended):
                diffs.append(Difference(f"{section}.{key}", x.get(key), y.get(key), note))

    asked = [f.name for f in fields(ServerConfig)]
    compare("asked", _section(a, "asked").get("config", {}), _section(b, "asked").get("config", {}), asked)
    ra, rb = _section(a, "resolved"), _section(b, "resolved")
    compare("resolved", ra, rb, RESOLVED_FIELDS)
    # pool differences follow from the dtype alone when the KV memory is the same and each pool is as predicted
    ca, cb = a.get("capacity") or {}, b.get("capacity") or {}
    same_memory = ca.get("kv_memory_bytes") is not None and ca.get("kv_memory_bytes") == cb.get("kv_memory_bytes")
    explained = same_memory and ca.get("match") is True and cb.get("match") is True
    if not (explained and _intended("resolved.kv_cache_dtype", intended)):
        note = "not explained by the KV dtype alone: KV memory differs or a pool is off its prediction"
        compare("resolved", ra, rb, DERIVED_FIELDS, note)
    for name, keys in (("model", MODEL_FIELDS), ("hardware", HARDWARE_FIELDS)):
        compare(name, a.get(name) or {}, b.get(name) or {}, keys)
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    compare("versions", va, vb, (k for k in sorted(set(va) | set(vb)) if k != "kvstudy"))
    return diffs
