"""Generate the small test checkpoints in data/checkpoints: one per way a folder declares KV scales.

Each checkpoint is a Qwen3-shaped model folder (``config.json`` + safetensors) with tiny random
weights (fixed seed) and, depending on the case, KV scale tensors under one of the names vLLM
loads, a ``quantization_config`` or an ``hf_quant_config.json``. They are not meant to be served:
they exercise the scale inspector (``kvstudy.model.scales``). The output is byte-for-byte deterministic.
Also the KV-precision study's positive control (``build_control``, below), made from a real Qwen3 folder.

    kvstudy checkpoints build data/checkpoints
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from kvstudy.errors import StudyError
from kvstudy.io import check_write_target, file_digest, read_bytes_checked, read_json_object, write_text_atomic
from kvstudy.model.scales import F8_VALUES, decode
from kvstudy.outputs import claim_output_folder, record_says

SEED = 20261129
LAYERS = 4
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 8
INTERMEDIATE = 64
VOCAB = 128

# name -> (dtype, values as float32); written in the given dtype
Tensors = dict[str, tuple[str, np.ndarray]]


# --------------------------------------------------------------------------- encoding and writing


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def to_f8_e4m3_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest float8 e4m3fn byte (finite values only)."""
    table = np.nan_to_num(F8_VALUES["F8_E4M3"].astype(np.float64), nan=np.inf)
    flat = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    codes = np.abs(flat - table.reshape(1, -1)).argmin(axis=1)
    return codes.astype(np.uint8).reshape(np.shape(values))


# safetensors dtype -> (the safetensors package's name of it, float32 values -> its bytes)
_ENCODINGS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "BF16": ("bfloat16", to_bf16_bits),
    "F16": ("float16", lambda values: np.ascontiguousarray(values, dtype="<f2")),
    "F32": ("float32", lambda values: np.ascontiguousarray(values, dtype="<f4")),
    "F8_E4M3": ("float8_e4m3fn", to_f8_e4m3_bits),
}


def write_safetensors(path: Path, tensors: Tensors) -> None:
    """Write ``tensors`` with the safetensors package."""
    buffers = {name: np.ascontiguousarray(_ENCODINGS[dtype][1](values)) for name, (dtype, values) in tensors.items()}
    specs = {
        name: safetensors.TensorSpec(
            dtype=_ENCODINGS[tensors[name][0]][0],
            shape=list(np.shape(tensors[name][1])),
            data_ptr=buf.ctypes.data,
            data_len=buf.nbytes,
        )
        for name, buf in buffers.items()
    }
    check_write_target(path)  # the writer follows a symlink: refuse one
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.serialize_file(specs, str(path), {"format": "pt"})


def write_json(path: Path, data: object) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- model pieces


def base_config(**extra: object) -> dict[str, object]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    } | extra


def base_weights(rng: np.random.Generator, proj_dtype: str = "BF16") -> Tensors:
    """Every weight of the tiny Qwen3; projections in ``proj_dtype`` (F8_E4M3 adds weight/input scales)."""

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.05, size=shape).astype(np.float32)

    tensors: Tensors = {
        "model.embed_tokens.weight": ("BF16", normal(VOCAB, HIDDEN)),
        "model.norm.weight": ("BF16", np.ones(HIDDEN, np.float32)),
    }
    shapes = {
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTERMEDIATE),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for module, shape in shapes.items():
            weight = normal(*shape)
            if proj_dtype == "F8_E4M3":
                scale = np.float32(np.abs(weight).max() / 448.0)
                tensors[prefix + module + ".weight"] = ("F8_E4M3", weight / scale)
                tensors[prefix + module + ".weight_scale"] = ("F32", np.array(scale, np.float32))
                tensors[prefix + module + ".input_scale"] = ("F32", np.array(0.01, np.float32))
            else:
                tensors[prefix + module + ".weight"] = ("BF16", weight)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[prefix + norm + ".weight"] = ("BF16", np.ones(HIDDEN, np.float32))
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            tensors[prefix + norm + ".weight"] = ("BF16", np.ones(HEAD_DIM, np.float32))
    return tensors


def layer_scales(rng: np.random.Generator, per_head: bool = False) -> dict[str, np.ndarray]:
    """Calibrated-looking k and v scales (amax / 448) for every layer; keys 'k<layer>' / 'v<layer>'."""
    out = {}
    for layer in range(LAYERS):
        for kind, (low, high) in (("k", (0.03, 0.12)), ("v", (0.005, 0.03))):
            size = (KV_HEADS, 1, 1) if per_head else ()
            out[f"{kind}{layer}"] = np.round(rng.uniform(low, high, size=size), 5).astype(np.float32)
    return out


def named_scales(scales: dict[str, np.ndarray], pattern: str) -> Tensors:
    """Scale tensors named by ``pattern`` with ``{layer}`` and ``{kind}`` placeholders."""
    return {pattern.format(layer=key[1:], kind=key[0]): ("F32", value) for key, value in scales.items()}


FP8_QC = {"quant_method": "fp8", "activation_scheme": "static"}


def _ct_qc(strategy: str) -> dict[str, object]:
    return {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "quantization_status": "compressed",
        "config_groups": {},
        "ignore": ["lm_head"],
        "kv_cache_scheme": {
            "num_bits": 8,
            "type": "float",
            "strategy": strategy,
            "dynamic": False,
            "symmetric": True,
            "group_size": None,
            "observer": "minmax",
        },
    }


# --------------------------------------------------------------------------- the checkpoints


K_SCALE = "model.layers.{layer}.self_attn.{kind}_scale"
OUTPUT_SCALE = "model.layers.{layer}.self_attn.{kind}_proj.output_scale"


def _single(folder: Path, config: dict[str, object], tensors: Tensors) -> None:
    write_json(folder / "config.json", config)
    write_safetensors(folder / "model.safetensors", tensors)


def _case(
    scales: str = "",
    fp8: bool = False,
    shape: tuple[int, ...] = (),
    files: dict[str, object] | None = None,
    kinds: str = "kv",
    **config: object,
) -> Callable[[Path, np.random.Generator], None]:
    """A single-file checkpoint: the weights (FP8 projections with ``fp8``), then the ``kinds`` of KV scales
    named by the pattern ``scales`` (none when empty; ``shape`` (1,) or, per head, (KV_HEADS, 1, 1)), the
    config's extra fields, and other JSON ``files``."""

    def build(folder: Path, rng: np.random.Generator) -> None:
        tensors = base_weights(rng, "F8_E4M3" if fp8 else "BF16")
        if scales:
            drawn = layer_scales(rng, per_head=shape == (KV_HEADS, 1, 1))
            kept = {k: v.reshape(shape or v.shape) for k, v in drawn.items() if k[0] in kinds}
            tensors.update(named_scales(kept, scales))
        _single(folder, base_config(**config), tensors)
        for name, data in (files or {}).items():
            write_json(folder / name, data)

    return build


def build_multi_shard(folder: Path, rng: np.random.Generator) -> None:
    tensors = base_weights(rng, "F8_E4M3")
    tensors.update(named_scales(layer_scales(rng), K_SCALE))
    write_json(folder / "config.json", base_config(quantization_config=FP8_QC))
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    weight_map = {name: shards[any(f"layers.{n}." in name for n in range(LAYERS // 2, LAYERS))] for name in tensors}
    for shard in shards:
        write_safetensors(folder / shard, {name: t for name, t in tensors.items() if weight_map[name] == shard})
    total = sum(_ENCODINGS[dtype][1](values).nbytes for dtype, values in tensors.values())
    write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )


def build_bad_scales(folder: Path, rng: np.random.Generator) -> None:
    """fp8 scales with a zero v scale in layer 1 and a NaN k scale in layer 3."""
    scales = layer_scales(rng)
    scales["v1"] = np.array(0.0, np.float32)
    scales["k3"] = np.array(np.nan, np.float32)
    tensors = base_weights(rng, "F8_E4M3")
    tensors.update(named_scales(scales, K_SCALE))
    _single(folder, base_config(quantization_config=FP8_QC), tensors)


@dataclass(frozen=True)
class CheckpointCase:
    name: str
    what: str
    build: Callable[[Path, np.random.Generator], None]


MODELOPT = {
    "producer": {"name": "modelopt", "version": "0.0.0-kvstudy-generated"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
}
CASES: tuple[CheckpointCase, ...] = (
    CheckpointCase("plain-bf16", "BF16 weights, no quantization config, no scales", _case()),
    CheckpointCase(
        "fp8-kv-scales",
        "quant_method fp8, FP8 weights, per-tensor self_attn.k_scale/v_scale",
        _case(K_SCALE, fp8=True, quantization_config=FP8_QC),
    ),
    CheckpointCase(
        "compressed-tensors-kv",
        "compressed-tensors kv_cache_scheme (tensor), k_proj/v_proj.output_scale",
        _case(OUTPUT_SCALE, shape=(1,), quantization_config=_ct_qc("tensor")),
    ),
    CheckpointCase(
        "modelopt-kv",
        "ModelOpt hf_quant_config.json kv_cache_quant_algo FP8, self_attn.k_proj.k_scale/v_proj.v_scale",
        _case(
            "model.layers.{layer}.self_attn.{kind}_proj.{kind}_scale",
            fp8=True,
            files={"hf_quant_config.json": MODELOPT},
        ),
    ),
    CheckpointCase(
        "deprecated-kv-scale",
        "quant_method fp8, one deprecated self_attn.kv_scale per layer",
        _case("model.layers.{layer}.self_attn.kv_scale", fp8=True, kinds="k", quantization_config=FP8_QC),
    ),
    CheckpointCase(
        "per-head-scales",
        "compressed-tensors kv_cache_scheme (attn_head), output_scale of shape [kv_heads, 1, 1]",
        _case(OUTPUT_SCALE, shape=(KV_HEADS, 1, 1), quantization_config=_ct_qc("attn_head")),
    ),
    CheckpointCase(
        "multi-shard", "quant_method fp8, two shards and an index, k/v scales in both shards", build_multi_shard
    ),
    # KV-only compressed-tensors scheme and no scale tensors: FP8 forced, scale 1.0, no warning
    CheckpointCase(
        "config-trap",
        "compressed-tensors kv_cache_scheme with no scale tensors",
        _case(quantization_config=_ct_qc("tensor")),
    ),
    # the field seed 002's one-line check prints
    CheckpointCase(
        "kv-dtype-field", "top-level config.json kv_cache_dtype fp8_e4m3, no scales", _case(kv_cache_dtype="fp8_e4m3")
    ),
    CheckpointCase(
        "bad-scales", "quant_method fp8 with a zero v scale (layer 1) and a NaN k scale (layer 3)", build_bad_scales
    ),
)


def build_all(out_dir: str | Path, names: Sequence[str] = (), force: bool = False) -> list[Path]:
    """Build the checkpoints (all, or those named) under ``out_dir`` (``outputs.claim_output_folder``), each from
    its own seeded RNG."""
    out = claim_output_folder(out_dir, "checkpoints build", force)
    built = []
    for number, case in enumerate(CASES):
        if names and case.name not in names:
            continue
        folder = out / case.name
        for old in folder.glob("*"):
            if old.is_file():
                old.unlink()
        case.build(folder, np.random.default_rng(SEED + number))
        built.append(folder)
    return built


# --------------------------------------------------------------------------- the positive control
# The positive control of the KV-precision study: a Qwen3 checkpoint whose K overflows FP8 at scale 1.0.
# Every layer's ``k_norm.weight`` is multiplied by ``factor`` and ``q_norm.weight`` divided by it: each
# score ``q · k`` is unchanged (exactly, for a power of two in bfloat16), but K leaves FP8 e4m3's range.
# Per-layer ``k_scale`` tensors bound K (after RMSNorm an element is at most ``max |k_norm.weight| *
# sqrt(head_dim)``, and RoPE rotates pairs), so "FP8 at scale 1.0" must lose and "FP8 with the
# checkpoint's scales" not. Torch-free: the same source gives the same bytes.

FACTOR = 2048.0  # a power of two: q·k is exactly unchanged in bfloat16
FP8_E4M3_MAX = 448.0
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
WEIGHTS = "model.safetensors"
RECORD = "control.json"
_NORM_RE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$")


def read_bf16_safetensors(path: Path) -> Tensors:
    """Every tensor of a single safetensors file (BF16 or F32) as float32 values."""
    try:
        tensors = safetensors.deserialize(read_bytes_checked(path, limit=1 << 30))
    except safetensors.SafetensorError as exc:
        raise StudyError(f"{path}: not a safetensors file ({exc})") from None
    out: Tensors = {}
    for name, info in tensors:
        if info["dtype"] not in ("BF16", "F32"):
            raise StudyError(f"{path}: tensor {name} is {info['dtype']}; expected BF16 or F32 weights")
        out[name] = (
            info["dtype"],
            decode(bytes(info["data"]), info["dtype"]).astype(np.float32).reshape(info["shape"]),
        )
    return out


GENERATOR = "kvstudy.tools.checkpoints.build_control"


_written_before = record_says(RECORD, "generator", lambda name: name == GENERATOR)


def build_control(
    source: str | Path, out: str | Path, factor: float = FACTOR, force: bool = False, scales: bool = True
) -> dict[str, Any]:
    """Write the scaled-K checkpoint of ``source`` into ``out`` (``outputs.claim_output_folder``); its record.
    ``scales`` False: no ``k_scale``/``v_scale`` tensors, so vLLM serves FP8 KV at scale 1.0 (a grade of the
    calibration ladder, ``kvstudy kv-calibrate``)."""
    source, out = Path(source), Path(out)
    if not (source / WEIGHTS).is_file():
        raise StudyError(f"{source}: no {WEIGHTS} (expected a single-file Qwen3 model folder)")
    if not factor > 1:
        raise StudyError(f"control factor: got {factor}, expected > 1")
    config = read_json_object(source / "config.json")
    if config.get("model_type") != "qwen3":
        raise StudyError(
            f"{source}/config.json: model_type {config.get('model_type')!r}, expected 'qwen3' (q_norm/k_norm)"
        )
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    tensors = read_bf16_safetensors(source / WEIGHTS)
    k_scales: dict[int, float] = {}
    for name, (dtype, values) in list(tensors.items()):
        match = _NORM_RE.match(name)
        if not match:
            continue
        layer, kind = int(match.group(1)), match.group(2)
        scaled = values * np.float32(factor) if kind == "k" else values / np.float32(factor)
        tensors[name] = (dtype, scaled.astype(np.float32))
        if kind == "k":
            k_scales[layer] = float(np.abs(scaled).max()) * math.sqrt(head_dim) / FP8_E4M3_MAX
    layers = int(config["num_hidden_layers"])
    if sorted(k_scales) != list(range(layers)):
        raise StudyError(f"{source}: k_norm weights for layers {sorted(k_scales)}, expected 0..{layers - 1}")
    for layer in range(layers if scales else 0):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = ("F32", np.array(k_scales[layer], dtype=np.float32))
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = ("F32", np.array(1.0, dtype=np.float32))
    claim_output_folder(out, "control-checkpoint", force, recognise=_written_before)
    write_safetensors(out / WEIGHTS, tensors)
    for name in COPIED:
        if (source / name).is_file():
            write_text_atomic(out / name, (source / name).read_text(encoding="utf-8"))
    record = {
        "what": "positive control: k_norm.weight * factor, q_norm.weight / factor"
        + (", k_scale bounds K" if scales else ", no KV scales (FP8 at scale 1.0)"),
        "generator": GENERATOR,
        "source": str(source),
        "source_weights_sha256": file_digest(source / WEIGHTS, weights_headers_only=False),
        "factor": factor,
        "head_dim": head_dim,
        "k_scales": [k_scales[i] for i in range(layers)] if scales else None,
        "v_scales": [1.0] * layers if scales else None,
        "weights_sha256": file_digest(out / WEIGHTS, weights_headers_only=False),
    }
    write_json(out / RECORD, record)
    return record


def ensure_control(source: str | Path, out: str | Path, factor: float = FACTOR) -> dict[str, Any]:
    """The control folder's record, building it when missing or made from other settings."""
    record_path = Path(out) / RECORD
    if record_path.is_file() and (Path(out) / WEIGHTS).is_file():
        record = read_json_object(record_path)
        same_source = record.get("source_weights_sha256") == file_digest(
            Path(source) / WEIGHTS, weights_headers_only=False
        )
        if same_source and record.get("factor") == factor:
            return dict(record)
    return build_control(source, out, factor)
