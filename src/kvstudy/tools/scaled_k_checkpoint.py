"""The positive control of the KV-precision study: a Qwen3 checkpoint whose K overflows FP8 at scale 1.0.

Every layer's ``k_norm.weight`` is multiplied by ``factor`` and ``q_norm.weight`` divided by it:
each score ``q · k`` is unchanged (exactly, for a power of two in bfloat16), but K leaves FP8
e4m3's range. Per-layer ``k_scale`` tensors bound K (after RMSNorm an element is at most
``max |k_norm.weight| * sqrt(head_dim)``, and RoPE rotates pairs), so "FP8 at scale 1.0" must lose
and "FP8 with the checkpoint's scales" not. Torch-free: the same source gives the same bytes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from kvstudy.errors import StudyError
from kvstudy.io import file_digest, read_bytes_checked, read_json_object, write_text_atomic
from kvstudy.model.safetensors import decode
from kvstudy.outputs import claim_output_folder, record_says
from kvstudy.tools.checkpoints import Tensors, write_json, write_safetensors

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


GENERATOR = "kvstudy.tools.scaled_k_checkpoint.build_control"


_written_before = record_says(RECORD, "generator", lambda name: name == GENERATOR)


def build_control(
    source: str | Path, out: str | Path, factor: float = FACTOR, force: bool = False, scales: bool = True
) -> dict[str, Any]:
    """Write the scaled-K checkpoint of ``source`` into ``out`` (new, empty or a control this command
    wrote: ``outputs.claim_output_folder``; any other folder only with ``force``); returns its record.
    ``scales`` False: no ``k_scale``/``v_scale`` tensors, so vLLM serves FP8 KV at scale 1.0 (a grade
    of the calibration ladder, ``kvstudy kv-calibrate``)."""
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
