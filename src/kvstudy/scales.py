"""What a model folder says about its KV cache: the config fields and the KV scale tensors.

``inspect_model`` reads ``config.json`` (``kv_cache_dtype``, ``torch_dtype``/``dtype``,
``quantization_config`` with its ``kv_cache_scheme``), ``hf_quant_config.json``
(``quantization.kv_cache_quant_algo``) and, from the safetensors files, only the tensors whose
names vLLM loads as KV scales. It reads the index or each file's header (8-byte little-endian
length, then JSON) and then seeks to the scale tensors' bytes: never the whole weights, and it
never unpickles a ``.bin`` file. Problems with the input are collected in ``errors`` and the scan
of the other files goes on. ``verdicts`` say what vLLM will do with what was found (facts from
vLLM's source as summarised in the project's notes), optionally checked against a startup log
or a resolved-run record.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import StudyError
from .modelfolder import resolve_model_path

INDEX_NAME = "model.safetensors.index.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
MAX_SCALE_BYTES = 1024 * 1024  # a KV scale is one value per tensor or per head: far below this
# quant_method values whose vLLM loader handles KV scales and warns when both end up 1.0.
WARNING_METHODS = {"fp8", "modelopt", "modelopt_fp4", "quark"}
ISSUE_54623 = "vLLM issue 54623"
# What a startup log or run record shows about the scales (ScaleReport.engine_outcome).
ENGINE_OUTCOMES = {
    "not-fp8": "the KV cache was not FP8: scales unused",
    "unit-scales": "scale-1.0 warning, and the checkpoint's scales are all 1.0",
    "dropped": "checkpoint has scales, log shows the scale-1.0 warning: the loader dropped them",
    "consistent": "checkpoint has scales, FP8, no warning: consistent with scales loaded",
    "warning-expected": "no scales, and the log warns about scale 1.0",
    "silent-unit-scale": "no scales, FP8, no warning: scale 1.0 used silently",
    "unknown": "the log does not say which KV dtype was used",
    "too-early": "the start failed before the weights were loaded: the log cannot say",
}

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
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


# --------------------------------------------------------------------------- records

@dataclass
class ScaleTensor:
    """One KV scale tensor as stored (a deprecated ``kv_scale`` yields one record per kind)."""

    layer: int | None  # the first dotted number in the name (decoder layer), None if none
    kind: str  # "k" or "v" (query scales are kept apart, see ScaleReport.q_scales)
    name: str
    file: str  # the safetensors file it was read from, relative to the model folder
    dtype: str
    shape: list[int]
    values: list[float]
    style: str  # which of vLLM's naming conventions it follows

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["values"] = [_json_number(v) for v in self.values]
        return data


@dataclass
class ScaleReport:
    """Everything KV-related found in one model folder, with verdicts and input errors."""

    source: str  # what was asked for: a folder, a config.json or a cache id
    folder: str | None  # the resolved model folder, None if it could not be resolved
    kv_cache_dtype_in_config: str | None  # config.json's KV dtype, wherever it is declared
    kv_cache_dtype_field: str | None  # where: "kv_cache_dtype", "quantization_config.kv_cache_dtype", ...
    torch_dtype: str | None  # config.json torch_dtype (or dtype, transformers 5)
    quant_method: str | None  # quantization_config.quant_method
    kv_scheme: dict[str, Any] | None  # quantization_config.kv_cache_scheme as written
    kv_scheme_strategy: str | None  # its strategy: "tensor", "attn_head", ...
    kv_cache_quant_algo: str | None  # ModelOpt's, from hf_quant_config.json or quantization_config
    kv_cache_quant_algo_file: str | None  # which file declared it
    num_hidden_layers: int | None
    num_key_value_heads: int | None
    weights: str  # "safetensors", "bin-only" (not inspectable) or "none"
    files_read: list[str] = field(default_factory=list)
    scales: list[ScaleTensor] = field(default_factory=list)
    q_scales: list[ScaleTensor] = field(default_factory=list)
    bytes_read: int = 0
    config_read: bool = False
    verdicts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    checked_against: str | None = None  # the startup log or run record the verdicts used
    engine_outcome: str | None = None  # against that log: see ENGINE_OUTCOMES

    @property
    def has_scales(self) -> bool:
        return bool(self.scales)

    @property
    def readable(self) -> bool:
        """Whether anything at all could be read (config or a safetensors header)."""
        return self.config_read or bool(self.files_read)

    def scale_layers(self, kind: str) -> list[int]:
        return sorted({s.layer for s in self.scales if s.kind == kind and s.layer is not None})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scales"] = [s.to_dict() for s in self.scales]
        data["q_scales"] = [s.to_dict() for s in self.q_scales]
        data["has_scales"] = self.has_scales
        data["readable"] = self.readable
        return data


@dataclass
class EngineEvidence:
    """What a startup log or resolved-run record says the engine did about the KV cache."""

    source: str
    kv_cache_dtype: str | None  # the dtype the engine stored the KV cache in ("auto" counts as not FP8)
    kv_scale_warning: bool  # the "Using KV cache scaling factor 1.0" warning was printed
    version: str | None
    failed: bool = False  # the start failed
    weights_processed: bool = True  # the log goes past weight loading (pool sized, or ready)
    failure_cause: str | None = None


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


# --------------------------------------------------------------------------- config fields

def _read_json_file(path: Path, report: ScaleReport) -> Any | None:
    try:
        text = path.read_bytes()
    except OSError as exc:
        report.errors.append(f"{path}: cannot read ({exc.strerror or exc})")
        return None
    report.bytes_read += len(text)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        report.errors.append(f"{path}: not valid JSON ({' '.join(str(exc).split())}); expected a JSON object")
        return None


def _kv_dtype_in_config(config: dict[str, Any]) -> tuple[str | None, str | None]:
    places: list[tuple[str, Any]] = [("kv_cache_dtype", config.get("kv_cache_dtype"))]
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        places.append(("text_config.kv_cache_dtype", text_config.get("kv_cache_dtype")))
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        places.append(("quantization_config.kv_cache_dtype", qc.get("kv_cache_dtype")))
    for where, value in places:
        if value is not None:
            return str(value), where
    return None, None


def _first(config: dict[str, Any], *keys: str) -> Any:
    """A config value from the top level or from ``text_config`` (multimodal models)."""
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for key in keys:
        for source in (config, text_config):
            if source.get(key) is not None:
                return source[key]
    return None


def _read_config(folder: Path, report: ScaleReport) -> None:
    path = folder / "config.json"
    if not path.is_file():
        report.errors.append(f"{path}: file not found (expected a Hugging Face config.json)")
        return
    config = _read_json_file(path, report)
    if config is None:
        return
    if not isinstance(config, dict):
        report.errors.append(f"{path}: expected a JSON object at the top level, got {type(config).__name__}")
        return
    report.config_read = True
    report.kv_cache_dtype_in_config, report.kv_cache_dtype_field = _kv_dtype_in_config(config)
    dtype = _first(config, "torch_dtype", "dtype")
    report.torch_dtype = str(dtype) if dtype is not None else None
    layers, heads = _first(config, "num_hidden_layers"), _first(config, "num_key_value_heads")
    report.num_hidden_layers = layers if isinstance(layers, int) else None
    report.num_key_value_heads = heads if isinstance(heads, int) else None
    qc = config.get("quantization_config")
    if qc is None:
        return
    if not isinstance(qc, dict):
        report.errors.append(f"{path}: quantization_config: expected an object, got {type(qc).__name__}")
        return
    method = qc.get("quant_method")
    report.quant_method = str(method) if method is not None else None
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        report.kv_scheme = scheme
        strategy = scheme.get("strategy")
        report.kv_scheme_strategy = str(strategy) if strategy is not None else None
    elif scheme is not None:
        report.errors.append(f"{path}: quantization_config.kv_cache_scheme: expected an object or null, "
                             f"got {type(scheme).__name__}")
    algo = qc.get("kv_cache_quant_algo")
    if algo is not None:
        report.kv_cache_quant_algo, report.kv_cache_quant_algo_file = str(algo), "config.json"


def _read_hf_quant_config(folder: Path, report: ScaleReport) -> None:
    path = folder / HF_QUANT_CONFIG
    if not path.is_file():
        return
    data = _read_json_file(path, report)
    if data is None:
        return
    quant = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(quant, dict):
        report.errors.append(f"{path}: expected an object with a 'quantization' object")
        return
    algo = quant.get("kv_cache_quant_algo")
    if algo is not None:
        report.kv_cache_quant_algo, report.kv_cache_quant_algo_file = str(algo), HF_QUANT_CONFIG
    if report.quant_method is None:
        report.quant_method = "modelopt"


# --------------------------------------------------------------------------- safetensors

def scale_kinds(name: str) -> tuple[tuple[str, ...], str] | None:
    """The kinds ("k", "v", "q") and naming style of a tensor vLLM loads as a KV/query scale."""
    for ending, kinds, style in _SCALE_ENDINGS:
        if name.endswith(ending):
            return kinds, style
    return None


def layer_of(name: str) -> int | None:
    match = _LAYER_RE.search("." + name)
    return int(match.group(1)) if match else None


def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """float32 value of every byte of an 8-bit float (e4m3fn: no inf, 0x7f/0xff NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exp = ((codes >> man_bits) & ((1 << exp_bits) - 1)).astype(np.int64)
    man = (codes & ((1 << man_bits) - 1)).astype(np.float64)
    normal = (1.0 + man / (1 << man_bits)) * np.power(2.0, exp - bias)
    subnormal = (man / (1 << man_bits)) * 2.0 ** (1 - bias)
    values = sign * np.where(exp == 0, subnormal, normal)
    top = (1 << exp_bits) - 1
    if fn:
        values[(exp == top) & (man == (1 << man_bits) - 1)] = np.nan
    else:
        values[(exp == top) & (man == 0)] = sign[(exp == top) & (man == 0)] * np.inf
        values[(exp == top) & (man != 0)] = np.nan
    return values.astype(np.float32)


F8_E4M3_VALUES = _fp8_table(4, 3, 7, fn=True)
F8_E5M2_VALUES = _fp8_table(5, 2, 15, fn=False)


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """Little-endian safetensors bytes of one dtype as float64 values."""
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8").astype(np.float64)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float64)
    if dtype == "BF16":
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).astype(np.float64)
    if dtype == "F8_E4M3":
        return F8_E4M3_VALUES[np.frombuffer(raw, dtype=np.uint8)].astype(np.float64)
    if dtype == "F8_E5M2":
        return F8_E5M2_VALUES[np.frombuffer(raw, dtype=np.uint8)].astype(np.float64)
    raise ValueError(f"dtype {dtype} is not a float type (expected F32, F16, BF16, F8_E4M3, F8_E5M2 or F64)")


@dataclass
class _Header:
    path: Path
    data_start: int
    size: int
    tensors: dict[str, Any]


def read_header(path: Path, report: ScaleReport) -> _Header | None:
    """The JSON header of one safetensors file, or None with the reason in ``report.errors``."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            report.bytes_read += len(prefix)
            if len(prefix) < 8:
                report.errors.append(f"{path}: truncated safetensors file ({size} bytes; expected an 8-byte "
                                     "header length first)")
                return None
            length = int.from_bytes(prefix, "little")
            if length > size - 8:
                report.errors.append(f"{path}: header length {length} is larger than the file "
                                     f"({size} bytes); the file is truncated or not safetensors")
                return None
            if length > MAX_HEADER_BYTES:
                report.errors.append(f"{path}: header length {length} exceeds the safetensors limit of "
                                     f"{MAX_HEADER_BYTES} bytes")
                return None
            raw = fh.read(length)
            report.bytes_read += len(raw)
    except OSError as exc:
        report.errors.append(f"{path}: cannot read ({exc.strerror or exc})")
        return None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        report.errors.append(f"{path}: safetensors header is not valid JSON ({' '.join(str(exc).split())}); "
                             "the header is truncated or corrupt")
        return None
    if not isinstance(header, dict):
        report.errors.append(f"{path}: safetensors header is not a JSON object")
        return None
    header.pop("__metadata__", None)
    return _Header(path, 8 + length, size, header)


def _read_tensor(header: _Header, name: str, report: ScaleReport) -> tuple[str, list[int], np.ndarray] | None:
    where = f"{header.path}: tensor {name}"
    entry = header.tensors.get(name)
    if not isinstance(entry, dict):
        report.errors.append(f"{where}: not in this file's header (the index points to the wrong shard)")
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if (dtype not in _DTYPE_BYTES or not isinstance(shape, list) or not isinstance(offsets, list)
            or len(offsets) != 2 or not all(isinstance(x, int) and x >= 0 for x in shape + offsets)):
        report.errors.append(f"{where}: header entry {json.dumps(entry)} is not a float tensor with a shape "
                             "and data_offsets [begin, end]")
        return None
    begin, end = offsets
    count = math.prod(shape)
    if end - begin != count * _DTYPE_BYTES[dtype]:
        report.errors.append(f"{where}: data_offsets span {end - begin} bytes, but {dtype} {shape} needs "
                             f"{count * _DTYPE_BYTES[dtype]}")
        return None
    if end - begin > MAX_SCALE_BYTES:
        report.errors.append(f"{where}: {end - begin} bytes is too large for a KV scale (read skipped)")
        return None
    if header.data_start + end > header.size:
        report.errors.append(f"{where}: data ends at byte {header.data_start + end}, past the end of the "
                             f"file ({header.size} bytes); the shard is truncated")
        return None
    with header.path.open("rb") as fh:
        fh.seek(header.data_start + begin)
        raw = fh.read(end - begin)
    report.bytes_read += len(raw)
    return dtype, shape, decode(raw, dtype)


def _check_values(name: str, file: str, values: np.ndarray, report: ScaleReport) -> None:
    bad = []
    if np.isnan(values).any():
        bad.append("NaN")
    if np.isinf(values).any():
        bad.append("infinite")
    if (values == 0).any():
        bad.append("zero")
    if (values < 0).any():
        bad.append("negative")
    if bad:
        report.errors.append(f"{file}: tensor {name}: {', '.join(bad)} scale value(s) "
                             f"{[_json_number(float(v)) for v in values[:8]]}; expected finite positive scales")


def _collect_scales(header: _Header, names: Iterable[str], folder: Path, report: ScaleReport) -> None:
    rel = str(header.path.relative_to(folder)) if header.path.is_relative_to(folder) else str(header.path)
    for name in sorted(names):
        matched = scale_kinds(name)
        if matched is None:
            continue
        kinds, style = matched
        tensor = _read_tensor(header, name, report)
        if tensor is None:
            continue
        dtype, shape, values = tensor
        _check_values(name, str(header.path), values, report)
        for kind in kinds:
            record = ScaleTensor(layer_of(name), kind, name, rel, dtype, shape,
                                 [float(v) for v in values], style)
            (report.q_scales if kind == "q" else report.scales).append(record)


def _scan_index(folder: Path, report: ScaleReport) -> bool:
    """Scale tensors through the index; False when the index is unusable (then scan each file)."""
    path = folder / INDEX_NAME
    data = _read_json_file(path, report)
    if data is None:
        return False
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        report.errors.append(f"{path}: expected an object with a 'weight_map' of tensor name -> shard file")
        return False
    report.files_read.append(INDEX_NAME)
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if scale_kinds(name) is not None:
            by_shard.setdefault(shard, []).append(name)
    shards = set(weight_map.values())
    for shard in sorted(shards):
        if not (folder / shard).is_file():
            report.errors.append(f"{path}: names shard {shard}, which is not in {folder}")
    for shard, names in sorted(by_shard.items()):
        if not (folder / shard).is_file():
            continue
        header = read_header(folder / shard, report)
        if header is None:
            continue
        report.files_read.append(shard)
        _collect_scales(header, names, folder, report)
    return True


def _scan_files(files: Sequence[Path], folder: Path, report: ScaleReport) -> None:
    for path in files:
        header = read_header(path, report)
        if header is None:
            continue
        report.files_read.append(str(path.relative_to(folder)))
        _collect_scales(header, header.tensors.keys(), folder, report)


def _scan_weights(folder: Path, report: ScaleReport) -> None:
    files = sorted(folder.glob("*.safetensors"))
    if (folder / INDEX_NAME).is_file():
        report.weights = "safetensors"
        if _scan_index(folder, report):
            return
        _scan_files(files, folder, report)
        return
    if files:
        report.weights = "safetensors"
        _scan_files(files, folder, report)
        return
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    if pickles:
        report.weights = "bin-only"
        report.errors.append(f"{folder}: weights only in pickle files ({', '.join(pickles[:3])}); not inspectable "
                             "(kvstudy never unpickles a .bin), expected .safetensors")


# --------------------------------------------------------------------------- verdicts

def _kv_handling_method(report: ScaleReport) -> bool:
    return (report.quant_method or "").lower() in WARNING_METHODS


def _scale_summary(report: ScaleReport) -> str:
    k_layers, v_layers = report.scale_layers("k"), report.scale_layers("v")
    per_head = any(len(s.values) > 1 for s in report.scales)
    values = np.array([v for s in report.scales for v in s.values], dtype=float)
    finite = values[np.isfinite(values)]
    span = f"values {finite.min():.4g} to {finite.max():.4g}" if finite.size else "no finite values"
    styles = sorted({s.style for s in report.scales})
    total = f" of {report.num_hidden_layers}" if report.num_hidden_layers else ""
    return (f"KV scales present: k for {len(k_layers)}{total} layers, v for {len(v_layers)}{total} layers, "
            f"{'per head' if per_head else 'one per tensor'}, {span} ({'; '.join(styles)}).")


def _no_scale_verdict(report: ScaleReport) -> str:
    base = "No KV scale tensors in the checkpoint: with an FP8 KV cache vLLM uses scale 1.0 for k and v"
    method = report.quant_method
    if method is None:
        return base + (", and prints no warning: a plain (unquantized) checkpoint never triggers the "
                       "'Using KV cache scaling factor 1.0' warning, so a silent log does not mean scales loaded.")
    if _kv_handling_method(report):
        return base + (f"; with quant_method '{method}' vLLM should print the 'Using KV cache scaling "
                       "factor 1.0' warning.")
    return base + (f"; with quant_method '{method}' vLLM may print no warning (compressed-tensors "
                   "stays silent when scales are missing).")


def _forcing_verdicts(report: ScaleReport) -> list[str]:
    out = []
    if report.kv_scheme is not None:
        bits, kind = report.kv_scheme.get("num_bits"), report.kv_scheme.get("type")
        strategy = report.kv_scheme_strategy or "unset"
        out.append(
            f"config.json quantization_config.kv_cache_scheme ({kind} {bits}-bit, strategy {strategy}) "
            "declares an FP8 KV cache in the model folder: vLLM 0.20 stores KV in FP8 whatever "
            "--kv-cache-dtype says (an 'auto' vs 'fp8' A/B compares fp8 with fp8); 0.32 and 0.33 do so "
            "only when the flag is 'auto' (an explicit bfloat16 wins); 0.11 with 'auto' stays BF16.")
        if strategy not in ("tensor", "attn_head"):
            out.append(f"kv_cache_scheme strategy {strategy}: vLLM accepts only 'tensor' or 'attn_head' "
                       "and refuses to load this checkpoint.")
        if strategy == "attn_head":
            out.append("Per-head (attn_head) scales: vLLM keeps one scale per KV head for backends that take "
                       "them; a backend that takes one scale per layer uses the largest head's scale.")
    if report.kv_cache_quant_algo is not None:
        out.append(
            f"{report.kv_cache_quant_algo_file} declares kv_cache_quant_algo {report.kv_cache_quant_algo}: "
            f"from vLLM 0.14, --kv-cache-dtype auto resolves to it ({report.kv_cache_quant_algo.lower()}); "
            "0.11 with 'auto' stays BF16.")
    if report.kv_cache_dtype_in_config is not None:
        out.append(
            f"config.json sets {report.kv_cache_dtype_field} = {report.kv_cache_dtype_in_config}: a KV dtype "
            "declared in the model folder, not on the command line. vLLM 0.32.0's source does not read this "
            "field (other tools may); the startup log's KV dtype line says what the engine used.")
    return out


def _all_ones(report: ScaleReport) -> bool:
    return all(v == 1.0 for s in report.scales for v in s.values)


def _version_at_least(version: str | None, wanted: tuple[int, int]) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return match is None or (int(match.group(1)), int(match.group(2))) >= wanted  # unknown: assume recent


def effective_kv_dtype(report: ScaleReport, ev: EngineEvidence) -> str | None:
    """The KV dtype the engine used: the logged one, or for the flag 'auto' the folder's declaration."""
    logged = ev.kv_cache_dtype
    if logged is None or logged.lower() != "auto":
        return logged
    if report.kv_scheme is not None and _version_at_least(ev.version, (0, 20)):
        return declared_kv_dtype(report)
    if report.kv_cache_quant_algo is not None and _version_at_least(ev.version, (0, 14)):
        return report.kv_cache_quant_algo.lower()
    return logged


def engine_outcome(report: ScaleReport, ev: EngineEvidence) -> str:
    """One of ENGINE_OUTCOMES: what the log says happened to this checkpoint's scales."""
    fp8 = (effective_kv_dtype(report, ev) or "").lower().startswith("fp8")
    if not ev.kv_scale_warning and not ev.weights_processed:
        return "too-early"
    if ev.kv_cache_dtype is not None and not fp8 and not ev.kv_scale_warning:
        return "not-fp8"
    if report.has_scales and ev.kv_scale_warning:
        return "unit-scales" if _all_ones(report) else "dropped"
    if report.has_scales:
        return "consistent" if fp8 else "unknown"
    if ev.kv_scale_warning:
        return "warning-expected"
    return "silent-unit-scale" if fp8 else "unknown"


def _evidence_verdicts(report: ScaleReport, ev: EngineEvidence) -> list[str]:
    on = f"{ev.source}" + (f" (vLLM {ev.version})" if ev.version else "")
    outcome = engine_outcome(report, ev)
    report.engine_outcome = outcome
    text = {
        "not-fp8": f"the KV cache was stored as {ev.kv_cache_dtype}, so KV scales were not used.",
        "unit-scales": "the scale-1.0 warning is expected: every KV scale in the checkpoint is 1.0.",
        "dropped": ("the checkpoint has KV scales but the log shows the 'scaling factor 1.0' warning: "
                    f"the loader dropped them and FP8 ran with scale 1.0 (as in {ISSUE_54623})."),
        "consistent": ("FP8 KV cache and no scale-1.0 warning: consistent with the checkpoint's scales "
                       "being loaded (the log alone cannot prove it)."),
        "warning-expected": "the scale-1.0 warning matches the checkpoint, which has no KV scales.",
        "silent-unit-scale": ("FP8 KV cache, no scale-1.0 warning and no scales in the checkpoint: "
                              "scale 1.0 was used silently."),
        "unknown": "the log does not say which KV dtype was used; nothing to compare.",
        "too-early": ("the start failed before the weights were loaded (or while loading them), so the log "
                      "cannot say whether scales loaded."),
    }[outcome]
    if (ev.kv_cache_dtype or "").lower() == "auto" and effective_kv_dtype(report, ev) != ev.kv_cache_dtype:
        text += (f" The flag was 'auto': the folder's declaration made the KV cache "
                 f"{effective_kv_dtype(report, ev)}, although the log never names that dtype.")
    cause = f": {ev.failure_cause.rstrip('.')}" if ev.failure_cause else ""
    if ev.failed and outcome != "too-early":
        text += f" (The start failed afterwards, once the weights and scales were loaded{cause}.)"
    elif ev.failed:
        text += f" (Cause{cause or ': not named in the log'}.)"
    return [f"{on}: {text}"]


def _verdicts(report: ScaleReport, evidence: EngineEvidence | None) -> list[str]:
    out: list[str] = []
    if report.weights == "bin-only":
        out.append("Weights are only in pickle (.bin) files: KV scales cannot be inspected safely.")
    elif report.weights == "none":
        out.append("No weight files in the folder: whether KV scales exist cannot be checked here.")
    elif report.has_scales:
        out.append(_scale_summary(report))
        if report.num_hidden_layers:
            missing = sorted(set(range(report.num_hidden_layers)) - set(report.scale_layers("k")))
            if missing and len(missing) < report.num_hidden_layers:
                out.append(f"Layers without a k scale (they run with 1.0): {missing[:16]}.")
    elif report.files_read:
        out.append(_no_scale_verdict(report))
    out += _forcing_verdicts(report)
    if evidence is not None:
        out += _evidence_verdicts(report, evidence)
    return out


# --------------------------------------------------------------------------- engine evidence

def read_evidence(path: str | Path) -> EngineEvidence:
    """A startup log (text, parsed by kvstudy.startup_log) or a resolved-run record / parsed log (JSON)."""
    from .startup_log import parse_startup_log

    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: no such startup log or run record")
    if path.suffix == ".json":
        return _evidence_from_record(path)
    info = parse_startup_log(path)
    return EngineEvidence(str(path), info.kv_cache_dtype, bool(info.kv_scale_warning), info.version,
                          failed=bool(info.failed), weights_processed=_weights_processed(vars(info)),
                          failure_cause=info.failure_cause)


def _weights_processed(fields: dict[str, Any]) -> bool:
    """Whether a start got past weight loading, where vLLM prints the scale-1.0 warning."""
    if fields.get("failed") is not True:
        return True
    return any(fields.get(k) is not None for k in ("pool_tokens", "model_load_gib")) or fields.get("ready") is True


def _find_key(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        if key in data:
            return data[key]
        for value in data.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    return None


def _evidence_from_record(path: Path) -> EngineEvidence:
    from .modelfolder import read_json

    data = read_json(path)
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a JSON object (a resolved-run record or a parsed startup log)")
    resolved = data.get("resolved", data)
    warning = _find_key(resolved, "kv_scale_warning")
    if not isinstance(warning, bool):
        raise StudyError(f"{path}: expected a resolved-run record with a boolean 'kv_scale_warning'")
    dtype, version = _find_key(resolved, "kv_cache_dtype"), _find_key(resolved, "version")
    fields = {k: _find_key(resolved, k) for k in ("failed", "pool_tokens", "model_load_gib", "ready")}
    return EngineEvidence(str(path), str(dtype) if dtype is not None else None, warning,
                          str(version) if version is not None else None, failed=fields["failed"] is True,
                          weights_processed=_weights_processed(fields),
                          failure_cause=_find_key(resolved, "failure_cause") if fields["failed"] is True else None)


# --------------------------------------------------------------------------- public entry points

def _empty_report(source: str, folder: Path | None) -> ScaleReport:
    return ScaleReport(source=source, folder=str(folder) if folder else None, kv_cache_dtype_in_config=None,
                       kv_cache_dtype_field=None, torch_dtype=None, quant_method=None, kv_scheme=None,
                       kv_scheme_strategy=None, kv_cache_quant_algo=None, kv_cache_quant_algo_file=None,
                       num_hidden_layers=None, num_key_value_heads=None, weights="none")


def inspect_model(path_or_id: str | Path, log: str | Path | None = None,
                  cache_dir: str | Path | None = None) -> ScaleReport:
    """Read a model folder's KV settings and KV scale tensors; never raises for bad files.

    ``path_or_id`` is a folder, its config.json, or a cached Hugging Face id. ``log`` is an optional
    startup log or resolved-run record (JSON) to check the scales against. Problems found in the
    files end up in ``errors``; a log that cannot be read raises StudyError.
    """
    source = str(path_or_id)
    evidence = read_evidence(log) if log is not None else None
    try:
        folder = resolve_model_path(path_or_id, cache_dir)
    except StudyError as exc:
        report = _empty_report(source, None)
        report.errors.append(str(exc))
        return report
    report = _empty_report(source, folder)
    _read_config(folder, report)
    _read_hf_quant_config(folder, report)
    _scan_weights(folder, report)
    if evidence is not None:
        report.checked_against = evidence.source
    report.verdicts = _verdicts(report, evidence)
    return report


def inspect_cache(cache_dir: str | Path | None = None) -> list[ScaleReport]:
    """One report per model repository in the local Hugging Face cache (newest snapshot each)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound as exc:
        raise StudyError(f"{exc.cache_dir}: no Hugging Face cache here (expected a hub cache folder)") from None
    reports = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        report = inspect_model(newest.snapshot_path)
        report.source = repo.repo_id
        reports.append(report)
    return reports


# --------------------------------------------------------------------------- seed 002's dump check

def declared_kv_dtype(report: ScaleReport) -> str | None:
    """The KV dtype the folder itself declares (kv_cache_dtype field, kv_cache_scheme or ModelOpt algo)."""
    if report.kv_cache_dtype_in_config is not None:
        return report.kv_cache_dtype_in_config
    if report.kv_scheme is not None:
        bits, kind = report.kv_scheme.get("num_bits"), report.kv_scheme.get("type")
        return "fp8" if (bits, kind) == (8, "float") else f"{kind}{bits}"
    if report.kv_cache_quant_algo is not None:
        return report.kv_cache_quant_algo.lower()
    return None


def dump_kv_settings(root: str | Path, logs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """For every config.json under ``root``: its KV fields, and what a paired startup log says.

    ``logs`` maps a model folder (as found under ``root``, or its path relative to ``root``) to a
    startup log or a list of them (one row each). ``agree`` is None when there is nothing to compare, else whether the KV dtype
    declared in the folder matches the one the engine logged.
    """
    from .startup_log import parse_startup_log

    root = Path(root)
    if not root.is_dir():
        raise StudyError(f"{root}: not a folder (expected a folder holding model folders)")
    pairs = {str(Path(k)): v for k, v in (logs or {}).items()}
    rows = []
    for config in sorted(root.rglob("config.json")):
        folder = config.parent
        report = _empty_report(str(folder), folder)
        _read_config(folder, report)
        _read_hf_quant_config(folder, report)
        row: dict[str, Any] = {
            "config": str(config), "kv_cache_dtype": report.kv_cache_dtype_in_config,
            "quant_method": report.quant_method,
            "kv_cache_scheme": json.dumps(report.kv_scheme, sort_keys=True) if report.kv_scheme else None,
            "kv_cache_quant_algo": report.kv_cache_quant_algo, "declared": declared_kv_dtype(report),
            "log": None, "log_kv_dtype": None, "log_scale_warning": None, "log_pool_tokens": None,
            "log_version": None, "log_failure": None, "agree": None,
            "note": None, "errors": "; ".join(report.errors) or None}
        paired = pairs.get(str(folder)) or pairs.get(str(folder.relative_to(root)))
        for log in ([paired] if isinstance(paired, str) else list(paired or [None])):
            entry = dict(row)
            if log is not None:
                info = parse_startup_log(Path(log))
                entry.update(log=str(log), log_kv_dtype=info.kv_cache_dtype, log_scale_warning=info.kv_scale_warning,
                             log_pool_tokens=info.pool_tokens, log_version=info.version,
                             log_failure=info.failure_cause if info.failed else None)
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
        return None, ("the log shows only the flag 'auto'; with 'auto' vLLM 0.14+ (ModelOpt) and 0.20+ "
                      "(compressed-tensors) store the KV cache as the folder declares")
    if _norm_kv_dtype(declared) == _norm_kv_dtype(logged):
        return True, None
    return False, "the engine stored the KV cache in another dtype than the folder declares"


# --------------------------------------------------------------------------- notebook helpers

def _span(values: Sequence[float]) -> str | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    return f"{low:.4g}" if low == high else f"{low:.4g} to {high:.4g}"


def findings_table(reports: Sequence[ScaleReport]) -> Any:
    """One row per report: what the folder declares, which scales it holds, what went wrong."""
    import pandas as pd

    rows = []
    for r in reports:
        k = [v for s in r.scales if s.kind == "k" for v in s.values]
        v = [v for s in r.scales if s.kind == "v" for v in s.values]
        rows.append({
            "model": r.source, "weights": r.weights, "quant method": r.quant_method,
            "declares KV": declared_kv_dtype(r), "scheme strategy": r.kv_scheme_strategy,
            "layers with k / v scales": f"{len(r.scale_layers('k'))} / {len(r.scale_layers('v'))}"
            + (f" of {r.num_hidden_layers}" if r.num_hidden_layers else ""),
            "naming": "; ".join(sorted({s.style for s in r.scales})) or None,
            "per head": any(len(s.values) > 1 for s in r.scales) if r.scales else None,
            "k scales": _span(k), "v scales": _span(v),
            "log check": r.engine_outcome, "bytes read": r.bytes_read, "errors": len(r.errors)})
    return pd.DataFrame(rows).astype(object).fillna("–")


def scale_values_frame(reports: Sequence[ScaleReport]) -> Any:
    """Long table of every stored scale value: model, layer, kind, head, value."""
    import pandas as pd

    rows = [{"model": r.source, "layer": s.layer, "kind": s.kind, "head": head, "value": value, "name": s.name}
            for r in reports for s in r.scales for head, value in enumerate(s.values)]
    return pd.DataFrame(rows, columns=["model", "layer", "kind", "head", "value", "name"])


def verdicts_markdown(reports: Sequence[ScaleReport]) -> str:
    parts = []
    for r in reports:
        lines = [f"**{r.source}**"] + [f"- {v}" for v in r.verdicts or ["(nothing could be read)"]]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def pool_comparisons(dump: Any) -> list[str]:
    """For folders logged under several KV flags: the pool each flag got (same KV memory assumed)."""
    if dump is None or len(dump) == 0 or "log_pool_tokens" not in dump:
        return []
    lines = []
    for config, rows in dump.dropna(subset=["log_pool_tokens"]).groupby("config", sort=True):
        if rows["log_kv_dtype"].nunique() < 2:
            continue
        parts = [f"{int(r.log_pool_tokens):,} tokens with {r.log_kv_dtype}" for r in rows.itertuples()]
        ratio = rows["log_pool_tokens"].max() / rows["log_pool_tokens"].min()
        lines.append(f"{Path(config).parent.name}: {' vs '.join(parts)} (ratio {ratio:.2f})")
    return lines


def summarize(reports: Sequence[ScaleReport], dump: Any = None) -> dict[str, Any]:
    """Counts behind the notebook's conclusion, a paragraph and a one-line finding."""
    readable = [r for r in reports if r.readable and r.weights == "safetensors"]
    counts = {
        "models": len(reports),
        "inspected": len(readable),
        "with_scales": sum(r.has_scales for r in readable),
        "declare_kv": sum(declared_kv_dtype(r) is not None for r in reports),
        "silent_unit_scale": sum(not r.has_scales and not _kv_handling_method(r) for r in readable),
        "with_errors": sum(bool(r.errors) for r in reports),
        "checked": sum(r.engine_outcome is not None for r in reports),
        "dropped": sum(r.engine_outcome == "dropped" for r in reports),
        "disagree": 0 if dump is None or len(dump) == 0 else int((dump["agree"] == False).sum()),  # noqa: E712
        "dump_compared": 0 if dump is None or len(dump) == 0 else int(dump["agree"].notna().sum()),
    }
    pool_lines = pool_comparisons(dump)
    counts["pool_comparisons"] = len(pool_lines)
    c = counts
    text = (f"Of {c['models']} model folders, {c['inspected']} had safetensors weights to inspect and "
            f"{c['with_scales']} of those carry KV scale tensors. Folders that declare a KV dtype themselves: "
            f"{c['declare_kv']}. Folders with no scales and no KV-handling quantization method, which run "
            f"`--kv-cache-dtype fp8` with scale 1.0 and no warning: {c['silent_unit_scale']}. "
            f"Folders with problems in their files: {c['with_errors']}. ")
    if c["checked"]:
        text += (f"Against {c['checked']} startup logs, {c['dropped']} show scales that the checkpoint has "
                 "but the loader dropped. ")
    if c["dump_compared"]:
        text += (f"In the settings dump, {c['disagree']} of {c['dump_compared']} logs used a KV dtype other than "
                 "the one the folder declares.")
    if pool_lines:
        text += " Logged pools of the same folder under different flags: " + "; ".join(pool_lines) + "."
    finding = (f"{c['with_scales']} of {c['inspected']} inspected checkpoints carry KV scales, "
               f"{c['declare_kv']} of {c['models']} folders declare their own KV dtype, and "
               f"{c['silent_unit_scale']} would run FP8 at scale 1.0 with no warning")
    if c["checked"]:
        finding += f"; {c['dropped']} of {c['checked']} logs show dropped scales"
    if c["dump_compared"]:
        finding += f"; {c['disagree']} of {c['dump_compared']} logs disagree with the folder's KV dtype"
    return {"counts": counts, "text": text, "finding": finding + "."}


# --------------------------------------------------------------------------- command line

def summary(report: ScaleReport) -> str:
    """A few human lines about one report."""
    lines = [f"{report.source}" + (f" ({report.folder})" if report.folder and report.folder != report.source else "")]
    pairs = [("config kv_cache_dtype", report.kv_cache_dtype_in_config), ("torch_dtype", report.torch_dtype),
             ("quant_method", report.quant_method), ("kv_cache_scheme", report.kv_scheme and json.dumps(report.kv_scheme)),
             ("kv_cache_quant_algo", report.kv_cache_quant_algo), ("weights", report.weights),
             ("files read", ", ".join(report.files_read) or None), ("bytes read", report.bytes_read)]
    lines += [f"  {k}: {v}" for k, v in pairs if v is not None]
    for scale in report.scales:
        values = ", ".join(f"{v:.6g}" for v in scale.values)
        lines.append(f"  layer {scale.layer} {scale.kind}: {values}  ({scale.name})")
    lines += [f"  verdict: {v}" for v in report.verdicts]
    lines += [f"  error: {e}" for e in report.errors]
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    if not args.models and not args.all_cache:
        raise StudyError("scales: give a model folder, a config.json or a cached id (or --all-cache)")
    reports = [inspect_model(spec, log=args.log, cache_dir=args.cache_dir) for spec in args.models]
    if args.all_cache:
        reports += inspect_cache(args.cache_dir)
        if not reports:
            raise StudyError(f"{args.cache_dir or 'the Hugging Face cache'}: no model repositories cached")
    for report in reports:
        for error in report.errors:
            print(f"kvstudy: {error}", file=sys.stderr)
    if args.json:
        payload: Any = [r.to_dict() for r in reports] if len(reports) != 1 else reports[0].to_dict()
        print(json.dumps(payload, indent=2))
    else:
        print("\n\n".join(summary(r) for r in reports))
    return 2 if any(not r.readable for r in reports) else 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy scales PATH_OR_ID... [--log FILE] [--all-cache] [--json]``."""
    parser = subparsers.add_parser(
        "scales", help="find a checkpoint's KV settings and KV scale tensors (reads only their bytes)")
    parser.add_argument("models", nargs="*", metavar="PATH_OR_ID",
                        help="model folder, its config.json, or a cached Hugging Face id")
    parser.add_argument("--log", help="a vLLM startup log or resolved-run record (JSON) to check the scales against")
    parser.add_argument("--all-cache", action="store_true", help="also scan every model in the local Hugging Face cache")
    parser.add_argument("--cache-dir", help="the Hugging Face hub cache for ids and --all-cache (default: HF_HUB_CACHE)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.set_defaults(func=_cmd)
