"""What a model folder says about its KV cache: the config fields and the KV scale tensors.

Only the config files, the safetensors index or headers and the scale tensors' own bytes are read
(never the whole weights, never a pickle: the 8-byte header length, the JSON header, then only the
bytes of the tensors asked for); problems are collected in the report's ``errors`` and the scan of
the other files goes on. Verdicts say what vLLM will do with what was found, optionally
checked against a startup log or a resolved-run record.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvstudy.errors import StudyError
from kvstudy.io import check_regular_file, parse_json_text, read_bytes_checked, read_json_object, short_repr, type_name
from kvstudy.limits import MAX_LAYERS
from kvstudy.model.config_fields import (
    HF_QUANT_CONFIG,
    cached_snapshots,
    checkpoint_kv_dtype,
    config_int,
    resolve_model_path,
)
from kvstudy.model.scale_verdicts import (
    ScaleReport,
    ScaleTensor,
    _json_number,
    declared_kv_dtype,
    read_evidence,
    verdicts,
)
from kvstudy.vllm.startup_log import parse_startup_log

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
MAX_SCALE_BYTES = 1024 * 1024  # a KV scale is one value per tensor or per head: far below this
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


# float32 value of every byte of an 8-bit float, through float16, whose layout both embed: E5M2 is its
# top byte; E4M3's exponent and mantissa bits sit one bit lower there (bias 15 against 7: x 2^8), and
# E4M3FN has no infinity, 0x7f/0xff are NaN
_CODES = np.arange(256, dtype=np.uint16)
F8_VALUES = {
    "F8_E4M3": ((_CODES & 0x80) << 8 | (_CODES & 0x7F) << 7).view(np.float16).astype(np.float32) * 256,
    "F8_E5M2": (_CODES << 8).view(np.float16).astype(np.float32),
}
F8_VALUES["F8_E4M3"][[0x7F, 0xFF]] = np.nan


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """Little-endian safetensors bytes of one dtype as float64 values."""
    if dtype in ("F64", "F32", "F16"):
        return np.frombuffer(raw, dtype=f"<f{DTYPE_BYTES[dtype]}").astype(np.float64)
    if dtype == "BF16":
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).astype(np.float64)
    if dtype in F8_VALUES:
        return F8_VALUES[dtype][np.frombuffer(raw, dtype=np.uint8)].astype(np.float64)
    raise ValueError(f"dtype {dtype} is not a float type (expected F32, F16, BF16, F8_E4M3, F8_E5M2 or F64)")


@dataclass
class SafetensorsHeader:
    path: Path
    data_start: int
    size: int
    tensors: dict[str, Any]


def read_header(path: Path, sink: ScaleReport) -> SafetensorsHeader | None:
    """The JSON header of one safetensors file, or None with the reason in ``sink.errors``."""
    try:
        fd = os.open(check_regular_file(path), os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise StudyError(f"{path}: not a regular file (expected a safetensors file)")
            size = st.st_size
            prefix = fh.read(8)
            sink.bytes_read += len(prefix)
            if len(prefix) < 8:
                raise StudyError(
                    f"{path}: truncated safetensors file ({size} bytes; expected an 8-byte header length first)"
                )
            length = int.from_bytes(prefix, "little")
            if length > size - 8:
                raise StudyError(
                    f"{path}: header length {length} is larger than the file "
                    f"({size} bytes); the file is truncated or not safetensors"
                )
            if length > MAX_HEADER_BYTES:
                raise StudyError(
                    f"{path}: header length {length} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes"
                )
            raw = fh.read(length)
            sink.bytes_read += len(raw)
        header = parse_json_text(raw, f"{path}: safetensors header is not valid JSON (truncated or corrupt)")
        if not isinstance(header, dict):
            raise StudyError(f"{path}: safetensors header is not a JSON object")
    except StudyError as exc:
        sink.errors.append(str(exc))
        return None
    except OSError as exc:
        sink.errors.append(f"{path}: cannot read ({exc.strerror or exc})")
        return None
    header.pop("__metadata__", None)
    return SafetensorsHeader(path, 8 + length, size, header)


def read_tensor(header: SafetensorsHeader, name: str, sink: ScaleReport) -> tuple[str, list[int], np.ndarray] | None:
    """The dtype, shape and values of tensor ``name``, or None with the reason in ``sink.errors``."""
    where = f"{header.path}: tensor {name}"
    entry = header.tensors.get(name)
    try:
        if not isinstance(entry, dict):
            raise StudyError(f"{where}: not in this file's header (the index points to the wrong shard)")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or dtype not in DTYPE_BYTES
            or not isinstance(shape, list)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or len(shape) > 8
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48 for x in shape + offsets)
        ):
            raise StudyError(
                f"{where}: header entry {json.dumps(entry)[:200]} is not a float tensor with a shape "
                "and data_offsets [begin, end]"
            )
        begin, end = offsets
        needed = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != needed:
            raise StudyError(f"{where}: data_offsets span {end - begin} bytes, but {dtype} {shape} needs {needed}")
        if end - begin > MAX_SCALE_BYTES:
            raise StudyError(f"{where}: {end - begin} bytes is too large for a KV scale (read skipped)")
        if header.data_start + end > header.size:
            raise StudyError(
                f"{where}: data ends at byte {header.data_start + end}, past the end of the "
                f"file ({header.size} bytes); the shard is truncated"
            )
        with open(check_regular_file(header.path), "rb") as fh:
            fh.seek(header.data_start + begin)
            raw = fh.read(end - begin)
        if len(raw) != end - begin:
            raise StudyError(f"{where}: the file ended early (truncated shard)")
    except OSError as exc:
        sink.errors.append(f"{where}: cannot read ({exc})")
        return None
    except StudyError as exc:
        sink.errors.append(str(exc))
        return None
    sink.bytes_read += len(raw)
    return dtype, shape, decode(raw, dtype)


INDEX_NAME = "model.safetensors.index.json"
# (name ending, kinds, naming style). Order matters: longer endings first.
_SCALE_ENDINGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (".k_proj.output_scale", ("k",), "compressed-tensors/Quark output_scale"),
    (".v_proj.output_scale", ("v",), "compressed-tensors/Quark output_scale"),
    (".q_proj.output_scale", ("q",), "compressed-tensors/Quark output_scale"),
    (".k_cache.scale", ("k",), "k_cache.scale"),
    (".v_cache.scale", ("v",), "v_cache.scale"),
    (".k_proj.k_scale", ("k",), "ModelOpt k_proj.k_scale"),
    (".v_proj.v_scale", ("v",), "ModelOpt v_proj.v_scale"),
    (".kv_scale", ("k", "v"), "deprecated kv_scale (copied to k and v)"),
    (".k_scale", ("k",), "k_scale"),
    (".v_scale", ("v",), "v_scale"),
    (".q_scale", ("q",), "q_scale"),
)
_LAYER_RE = re.compile(r"\.(\d+)\.")


def _read_json_object(path: Path, report: ScaleReport) -> dict[str, Any] | None:
    """A JSON file's object, or None with the reason in the report (the file then counts as unread)."""
    try:
        text = read_bytes_checked(path)
        report.bytes_read += len(text)
        data = parse_json_text(text, f"{path}: not valid JSON (expected a JSON object)")
        if not isinstance(data, dict):
            raise StudyError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
        return data
    except StudyError as exc:
        report.errors.append(str(exc))
        report.files_unread.append(str(path))
        return None


def _inside(folder: Path, name: str, index: Path, report: ScaleReport) -> Path | None:
    """The shard ``name`` of an index if it resolves (symlinks too) inside ``folder``, else None
    with the reason in the report: an index never makes kvstudy read another folder's files."""
    try:
        root = folder.resolve(strict=True)
        target = (folder / name).resolve()
    except (OSError, RuntimeError):
        target = None
    if target is None or not target.is_relative_to(root) or Path(name).is_absolute() or "\x00" in name:
        report.errors.append(f"{index}: shard {name[:200]!r} is outside the model folder {folder} (not read)")
        report.files_unread.append(name[:200])
        return None
    return folder / name


def _first(config: dict[str, Any], keys: tuple[str, ...], nests: tuple[str, ...] = ("text_config",)) -> tuple[Any, str]:
    """A config value and its field, from the top level or else an object nested under ``nests``
    (``text_config``: multimodal models); (None, "") when absent."""
    for key in keys:
        for prefix in ("", *nests):
            holder = config.get(prefix) if prefix else config
            if isinstance(holder, dict) and holder.get(key) is not None:
                return holder[key], f"{prefix}.{key}".lstrip(".")
    return None, ""


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _read_config(folder: Path, report: ScaleReport) -> None:
    path = folder / "config.json"
    if not path.is_file():
        report.errors.append(f"{path}: file not found (expected a Hugging Face config.json)")
        return
    config = _read_json_object(path, report)
    if config is None:
        return
    try:  # the fields read here, checked here (the rest of the config is not this command's business)
        kv_dtype, kv_field = _first(config, ("kv_cache_dtype",), ("text_config", "quantization_config"))
        dtype = _first(config, ("torch_dtype", "dtype"))[0]
        for name, value in (("torch_dtype", dtype), (kv_field, kv_dtype)):
            if value is not None and not isinstance(value, str):
                raise StudyError(
                    f"{path}: field '{name}' is {type_name(value)} {short_repr(value)} (expected a dtype name)"
                )
        shape = {k: _first(config, (k,))[0] for k in ("num_hidden_layers", "num_key_value_heads")}
        layers = config_int(shape, "num_hidden_layers", str(path), high=MAX_LAYERS, default=0) or None
        heads = config_int(shape, "num_key_value_heads", str(path), default=0) or None
    except StudyError as exc:
        report.errors.append(str(exc))
        report.files_unread.append(str(path))
        return
    report.config_read = True
    report.kv_cache_dtype_in_config, report.kv_cache_dtype_field = kv_dtype, kv_field or None
    report.torch_dtype = dtype
    report.num_hidden_layers, report.num_key_value_heads = layers, heads
    qc = config.get("quantization_config")
    if qc is None:
        return
    if not isinstance(qc, dict):
        report.errors.append(f"{path}: quantization_config: expected an object, got {type(qc).__name__}")
        return
    report.quant_method = _text(qc.get("quant_method"))
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        report.kv_scheme, report.kv_scheme_strategy = scheme, _text(scheme.get("strategy"))
    elif scheme is not None:
        report.errors.append(
            f"{path}: quantization_config.kv_cache_scheme: expected an object or null, got {type(scheme).__name__}"
        )
    algo = qc.get("kv_cache_quant_algo")
    if algo is not None:
        report.kv_cache_quant_algo, report.kv_cache_quant_algo_file = str(algo), "config.json"


def _read_hf_quant_config(folder: Path, report: ScaleReport) -> None:
    path = folder / HF_QUANT_CONFIG
    if not path.is_file():
        return
    data = _read_json_object(path, report)
    if data is None:
        return
    quant = data.get("quantization")
    if not isinstance(quant, dict):
        report.errors.append(f"{path}: expected an object with a 'quantization' object")
        return
    algo = quant.get("kv_cache_quant_algo")
    if algo is not None:
        report.kv_cache_quant_algo, report.kv_cache_quant_algo_file = str(algo), HF_QUANT_CONFIG
    if report.quant_method is None:
        report.quant_method = "modelopt"


def scale_kinds(name: str) -> tuple[tuple[str, ...], str] | None:
    """The kinds ("k", "v", "q") and naming style of a tensor vLLM loads as a KV/query scale."""
    return next(((kinds, style) for ending, kinds, style in _SCALE_ENDINGS if name.endswith(ending)), None)


def layer_of(name: str) -> int | None:
    """The layer index in a tensor name; None when there is none or it is past any model's layers."""
    match = _LAYER_RE.search("." + name)
    if not match or len(match.group(1)) > len(str(MAX_LAYERS)):
        return None
    return int(match.group(1))


def _scan_index(folder: Path, report: ScaleReport) -> bool:
    """Scale tensors through the index; False when the index is unusable (then scan each file)."""
    path = folder / INDEX_NAME
    data = _read_json_object(path, report)
    if data is None:
        return False
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        report.errors.append(f"{path}: expected an object with a 'weight_map' of tensor name -> shard file")
        return False
    report.files_read.append(INDEX_NAME)
    by_shard: dict[str, list[str]] = {shard: [] for shard in weight_map.values()}
    for name, shard in weight_map.items():
        if scale_kinds(name) is not None:
            by_shard[shard].append(name)
    for shard, names in sorted(by_shard.items()):
        where = _inside(folder, shard, path, report)
        if where is not None and not where.exists():
            report.errors.append(f"{path}: names shard {shard}, which is not in {folder}")
            report.files_unread.append(shard)
        elif where is not None and names:
            _scan_file(where, names, folder, report)
    return True


def _scan_file(path: Path, names: Iterable[str] | None, folder: Path, report: ScaleReport) -> None:
    """The scale tensors ``names`` (None: every tensor the header lists) of one safetensors file."""
    header, rel = read_header(path, report), str(path.relative_to(folder))
    if header is None:
        report.files_unread.append(rel)
        return
    report.files_read.append(rel)
    for name in sorted(header.tensors.keys() if names is None else names):
        matched = scale_kinds(name)
        if matched is None:
            continue
        kinds, style = matched
        layer, digits = layer_of(name), _LAYER_RE.search("." + name)
        if digits and layer is None:
            report.errors.append(
                f"{header.path}: tensor {name[:80]}...: a layer number of {len(digits.group(1)):,} digits "
                f"(expected a layer below {MAX_LAYERS:,}); not read"
            )
            continue
        tensor = read_tensor(header, name, report)
        if tensor is None:
            continue
        dtype, shape, values = tensor
        checks = {"NaN": np.isnan(values), "infinite": np.isinf(values), "zero": values == 0, "negative": values < 0}
        bad = [word for word, hit in checks.items() if hit.any()]
        if bad:
            report.errors.append(
                f"{header.path}: tensor {name}: {', '.join(bad)} scale value(s) "
                f"{[_json_number(float(v)) for v in values[:8]]}; expected finite positive scales"
            )
        for kind in kinds:
            record = ScaleTensor(layer, kind, name, rel, dtype, shape, [float(v) for v in values], style)
            (report.q_scales if kind == "q" else report.scales).append(record)


def _scan_weights(folder: Path, report: ScaleReport) -> None:
    files = sorted(folder.glob("*.safetensors"))
    indexed = (folder / INDEX_NAME).is_file()
    if indexed or files:
        report.weights = "safetensors"
        if not (indexed and _scan_index(folder, report)):  # an unusable index: each file's header
            for path in files:
                _scan_file(path, None, folder, report)
        return
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    if pickles:
        report.weights = "bin-only"
        report.errors.append(
            f"{folder}: weights only in pickle files ({', '.join(pickles[:3])}); not inspectable "
            "(kvstudy never unpickles a .bin), expected .safetensors"
        )


def inspect_model(
    path_or_id: str | Path, log: str | Path | None = None, cache_dir: str | Path | None = None
) -> ScaleReport:
    """Read a model folder's KV settings and KV scale tensors, checked against ``log`` when given;
    problems in the folder's files go to ``errors``, a log that cannot be read raises StudyError."""
    source = str(path_or_id)
    evidence = read_evidence(log) if log is not None else None
    try:
        folder = resolve_model_path(path_or_id, cache_dir)
    except StudyError as exc:
        return ScaleReport(source, None, errors=[str(exc)])
    report = ScaleReport(source, str(folder), checked_against=None if log is None else str(Path(log)))
    _read_config(folder, report)
    _read_hf_quant_config(folder, report)
    _scan_weights(folder, report)
    report.verdicts = verdicts(report, evidence)
    return report


def inspect_cache(cache_dir: str | Path | None = None) -> list[ScaleReport]:
    """One report per model repository in the local Hugging Face cache (newest snapshot each)."""
    return [
        replace(inspect_model(path), source=repo_id) for repo_id, path in sorted(cached_snapshots(cache_dir).items())
    ]


def dump_kv_settings(root: str | Path, logs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """For every config.json under ``root``: its KV fields, and what each paired startup log says
    (``logs``: model folder, absolute or relative to ``root`` -> a log or a list of them)."""
    root = Path(root)
    if not root.is_dir():
        raise StudyError(f"{root}: not a folder (expected a folder holding model folders)")
    pairs = {str(Path(k)): v for k, v in (logs or {}).items()}
    rows = []
    for config in sorted(root.rglob("config.json")):
        folder = config.parent
        report = ScaleReport(str(folder), str(folder))
        _read_config(folder, report)
        _read_hf_quant_config(folder, report)
        try:  # what vLLM's 'auto' stores, from config.json or the hf_quant_config.json beside it
            chosen = checkpoint_kv_dtype(read_json_object(config), folder)
        except StudyError:
            chosen = (None, None)
        row: dict[str, Any] = {
            "config": str(config),
            "kv_cache_dtype": report.kv_cache_dtype_in_config,
            "quant_method": report.quant_method,
            "kv_cache_scheme": json.dumps(report.kv_scheme, sort_keys=True) if report.kv_scheme else None,
            "kv_cache_quant_algo": report.kv_cache_quant_algo,
            "declared": declared_kv_dtype(report),
            "auto_stores": chosen[0],
            "auto_chosen_by": chosen[1],
            **dict.fromkeys(
                "log log_kv_dtype log_scale_warning log_pool_tokens log_version log_failure agree note".split()
            ),
            "errors": "; ".join(report.errors) or None,
        }
        paired = pairs.get(str(folder)) or pairs.get(str(folder.relative_to(root)))
        for log in [paired] if isinstance(paired, str) else list(paired or [None]):
            entry = dict(row)
            if log is not None:
                info = parse_startup_log(Path(log))
                entry.update(
                    log=str(log),
                    log_kv_dtype=info.kv_cache_dtype,
                    log_scale_warning=info.kv_scale_warning,
                    log_pool_tokens=info.pool_tokens,
                    log_version=info.version,
                    log_failure=info.failure_cause if info.failed else None,
                )
                entry["agree"], entry["note"] = _compare_kv_dtypes(entry["declared"], info.kv_cache_dtype)
            rows.append(entry)
    return rows


def _norm_kv_dtype(text: str) -> str:
    text = text.lower()
    return "fp8" if text in ("fp8", "fp8_e4m3", "float8_e4m3fn") else text


def _compare_kv_dtypes(declared: str | None, logged: str | None) -> tuple[bool | None, str | None]:
    """(agree, note) for the KV dtype a folder declares and the one its startup log shows."""
    if declared is None or logged is None:
        return None, None
    if logged.lower() == "auto":
        return None, (
            "the log shows only the flag 'auto'; with 'auto' vLLM 0.14+ (ModelOpt) and 0.20+ "
            "(compressed-tensors) store the KV cache as the folder declares"
        )
    if _norm_kv_dtype(declared) == _norm_kv_dtype(logged):
        return True, None
    return False, "the engine stored the KV cache in another dtype than the folder declares"


def summary(report: ScaleReport) -> str:
    """A few human lines about one report."""
    lines = [f"{report.source}" + (f" ({report.folder})" if report.folder and report.folder != report.source else "")]
    pairs = [
        ("config kv_cache_dtype", report.kv_cache_dtype_in_config),
        ("torch_dtype", report.torch_dtype),
        ("quant_method", report.quant_method),
        ("kv_cache_scheme", report.kv_scheme and json.dumps(report.kv_scheme)),
        ("kv_cache_quant_algo", report.kv_cache_quant_algo),
        ("weights", report.weights),
        ("files read", ", ".join(report.files_read) or None),
        ("bytes read", report.bytes_read),
    ]
    lines += [f"  {k}: {v}" for k, v in pairs if v is not None]
    for scale in report.scales:
        values = ", ".join(f"{v:.6g}" for v in scale.values)
        lines.append(f"  layer {scale.layer} {scale.kind}: {values}  ({scale.name})")
    lines += [f"  verdict: {v}" for v in report.verdicts]
    lines += [f"  error: {e}" for e in report.errors]
    return "\n".join(lines)
