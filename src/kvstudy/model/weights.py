"""Weight memory of a model: the checkpoint's own figure (the safetensors index's ``total_size``, else
the files' headers), else an estimate from ``config.json``: parameters per part, stored at the size the
checkpoint's ``quantization_config`` implies for the decoder's linear layers (embeddings, output head,
norms and towers stay 16-bit, as do the parts ``modules_to_not_convert`` names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import read_json, short_repr
from kvstudy.limits import MAX_EXPERTS, MAX_FACTOR
from kvstudy.model.config_fields import HF_QUANT_CONFIG, config_int, load_config, nemotron_h_pattern, usable_int
from kvstudy.model.layout import LINEAR, MLA, SHARED, LayerSpec, ModelLayout, layout_from_config, text_config
from kvstudy.vllm.facts import DTYPE_BYTES, KV_RULES_SOURCE


class WeightsUnknown(StudyError):
    """No checkpoint sizes and no estimate: the KV figures stand, the weights are unknown."""


@dataclass(frozen=True)
class WeightsSize:
    """Weight memory of a checkpoint and where the figure came from."""

    bytes: int
    source: str  # "safetensors index total_size", "safetensors headers", "estimated ..."


def _attention_parameters(cfg: dict[str, Any], layer: LayerSpec, hidden: int, heads: int, where: str) -> int:
    need = lambda key: config_int(cfg, key, where)  # noqa: E731 - a required positive field
    if layer.kind == LINEAR:
        if layer.state is not None and layer.state.kind in ("mamba2", "mamba1"):
            inner = layer.state.intermediate or layer.state.conv_dim
            conv = layer.state.conv_dim
            return hidden * (inner + conv + layer.state.heads) + inner * hidden + conv * layer.state.conv_kernel
        key = need("linear_num_key_heads") * need("linear_key_head_dim")
        value = need("linear_num_value_heads") * need("linear_value_head_dim")
        return hidden * (2 * key + 2 * value) + hidden * 2 * need("linear_num_value_heads") + value * hidden
    if layer.kind == MLA:
        q_rank = config_int(cfg, "q_lora_rank", where, default=0)
        qk_dim = need("qk_nope_head_dim") + need("qk_rope_head_dim")
        q = hidden * heads * qk_dim if not q_rank else hidden * q_rank + q_rank * heads * qk_dim
        kv = hidden * (need("kv_lora_rank") + need("qk_rope_head_dim"))
        kv += need("kv_lora_rank") * heads * (need("qk_nope_head_dim") + need("v_head_dim"))
        return q + kv + heads * need("v_head_dim") * hidden
    q_dim = heads * layer.head_size
    return hidden * q_dim + 2 * hidden * layer.num_kv_heads * layer.head_size + q_dim * hidden


def _experts(cfg: dict[str, Any]) -> int:
    value = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    return usable_int(value, MAX_EXPERTS) or 0


def expert_routing(config: dict[str, Any]) -> tuple[int | None, int | None]:
    """(routed experts per MoE layer, experts each token is routed to); None where the config has none."""
    cfg = text_config(config)
    picks = [cfg.get(key) for key in ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token")]
    k = next((v for v in picks if usable_int(v)), None)
    return _experts(cfg) or None, k


# up and down only (vllm ReLUSquaredActivation, is_act_and_mul=False)
NON_GATED_ACTS = frozenset({"relu2", "relu_squared"})


def _matrices(cfg: dict[str, Any], where: str) -> int:
    """Weight matrices of one MLP: 3 for a gated MLP (gate, up, down), 2 for relu2's up and down."""
    key = "mlp_hidden_act" if cfg.get("mlp_hidden_act") else "hidden_act"
    act = cfg.get(key)
    if act is not None and not isinstance(act, str):
        raise WeightsUnknown(f"{where}: '{key}' must be an activation name, got {type(act).__name__}")
    return 2 if act in NON_GATED_ACTS else 3


def _mlp_parameters(cfg: dict[str, Any], index: int, hidden: int, where: str) -> tuple[int, int]:
    """(dense or shared MLP parameters, routed-expert parameters) of one layer."""
    experts = _experts(cfg)
    dense_first = config_int(cfg, "first_k_dense_replace", where, low=0, default=0)
    step = config_int(cfg, "interleave_moe_layer_step", where, default=1)
    mats = _matrices(cfg, where)
    if experts and index >= dense_first and (index + 1) % step == 0:
        key = "moe_intermediate_size" if cfg.get("moe_intermediate_size") is not None else "intermediate_size"
        expert_size = config_int(cfg, key, where)
        shared = config_int(cfg, "n_shared_experts", where, low=0, default=0)
        shared_size = (
            config_int(cfg, "shared_expert_intermediate_size", where, low=0, default=0)
            or config_int(cfg, "moe_shared_expert_intermediate_size", where, low=0, default=0)
            or shared * expert_size
        )
        latent = config_int(cfg, "moe_latent_size", where, default=0)
        width = latent or hidden  # latent MoE (Nemotron-3): experts work in a smaller latent space
        projections = 2 * hidden * latent if latent else 0  # into and out of the latent space
        return mats * hidden * shared_size + hidden * experts + projections, mats * width * expert_size * experts
    key = "intermediate_size_mlp" if cfg.get("intermediate_size_mlp") else "intermediate_size"
    size = cfg.get(key)
    if isinstance(size, list) and size:  # gemma-3n: one width per layer
        size = size[index] if index < len(size) else size[-1]
    return mats * hidden * config_int({key: size}, key, where), 0


def _nas_mlp_parameters(cfg: dict[str, Any], index: int, hidden: int, where: str) -> int:
    """nemotron_nas.py: a block's MLP is absent when ``ffn.no_op``, else gated and of width
    ``_ffn_mult_to_intermediate_size(ffn_mult, hidden)``: int(2 * ffn_mult * hidden / 3) rounded up to 256."""
    blocks = cfg.get("block_configs")
    block = blocks[index] if isinstance(blocks, list) and index < len(blocks) else None
    ffn = block.get("ffn") if isinstance(block, dict) else None
    field = f"block_configs[{index}].ffn"
    if not isinstance(ffn, dict):
        raise StudyError(f"{where}: field '{field}' is missing (expected an object with ffn_mult or no_op)")
    if ffn.get("no_op"):
        return 0
    mult = ffn.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult <= MAX_FACTOR:
        raise StudyError(f"{where}: field '{field}.ffn_mult' is {short_repr(mult)} (expected a positive number)")
    width = -(-int(2 * mult * hidden / 3) // 256) * 256
    return _matrices(cfg, where) * hidden * width


def _tower_parameters(tower: Any) -> int:
    """A vision or audio encoder: per layer 4 h^2 (attention) + 2 h x MLP width (an estimate)."""
    if not isinstance(tower, dict):
        return 0
    hidden = tower.get("hidden_size") or tower.get("width") or 0
    depth = tower.get("num_hidden_layers") or tower.get("depth") or tower.get("num_layers") or 0
    mlp = tower.get("intermediate_size") or 4 * hidden
    if not all(usable_int(v) for v in (hidden, depth, mlp)):
        return 0
    return depth * (4 * hidden * hidden + 2 * hidden * mlp)


def parameter_parts(
    config: dict[str, Any], where: str = "config.json", layout: ModelLayout | None = None
) -> dict[str, int]:
    """Parameters per part: embedding, output_head, attention, mlp, experts, towers (biases and norms left out)."""
    cfg = text_config(config)
    layout = _rules_layout(config, where, layout)
    hidden = config_int(cfg, "hidden_size", where)
    vocab = config_int(cfg, "vocab_size", where)
    heads = config_int(cfg, "num_attention_heads", where)
    pattern = nemotron_h_pattern(cfg, where) if layout.model_type == "nemotron_h" else None  # MLPs at '-' and 'E'
    mlps = [
        (_nas_mlp_parameters(cfg, i, hidden, where), 0)
        if layout.model_type == "nemotron-nas"
        else _mlp_parameters(cfg, i, hidden, where)
        for i in range(layout.num_hidden_layers)
        if pattern is None or pattern[i] in "-E"
    ]
    return {
        "embedding": vocab * hidden,
        "output_head": 0 if cfg.get("tie_word_embeddings") else vocab * hidden,
        "attention": sum(
            _attention_parameters(cfg, l, hidden, heads, where) for l in layout.layers if l.kind != SHARED
        ),
        "mlp": sum(dense for dense, _ in mlps),
        "experts": sum(experts for _, experts in mlps),
        "towers": sum(_tower_parameters(config.get(key)) for key in ("vision_config", "audio_config")),
    }


def _quantized_bytes(quant: dict[str, Any], where: str) -> tuple[Fraction, str]:
    """Bytes per quantized weight and a label, from a quantization_config."""
    method = str(quant.get("quant_method") or "").lower()
    algo = str(quant.get("quant_algo") or "").upper()
    if method in ("fp8", "fbgemm_fp8") or (method == "modelopt" and algo.startswith("FP8")):
        return Fraction(1), "FP8, 1 byte per weight" + (" (ModelOpt)" if method == "modelopt" else "")
    if method == "mxfp4":
        return Fraction(1, 2) + Fraction(1, 32), "MXFP4, 4 bits + a 1-byte scale per 32 weights"
    if method in ("modelopt_fp4", "nvfp4") or "fp4" in str(quant.get("quant_algo", "")).lower():
        return Fraction(1, 2) + Fraction(1, 16), "NVFP4, 4 bits + a 1-byte scale per 16 weights"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = quant.get("bits") or quant.get("w_bit") or 4
        group = quant.get("group_size") or quant.get("q_group_size") or 128
        if not isinstance(bits, int) or not isinstance(group, int) or bits <= 0:
            raise StudyError(f"{where}: quantization_config bits {bits!r} / group_size {group!r} (expected integers)")
        group = group if group > 0 else 4096  # -1: one group per row; counted as a large group
        per = Fraction(bits, 8) + Fraction(2, group) + Fraction(bits, 8 * group)
        return per, f"{method.upper()} {bits}-bit, a 16-bit scale and a zero point per {group} weights"
    if method == "bitsandbytes":
        if quant.get("load_in_4bit"):
            return Fraction(1, 2) + Fraction(4, 64), "bitsandbytes 4-bit, a 4-byte absmax per 64 weights"
        if quant.get("load_in_8bit"):
            return Fraction(1) + Fraction(4, 4096), "bitsandbytes 8-bit, one 4-byte scale per row"
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, dict) else []:
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
                bits = weights["num_bits"]
                size = weights.get("group_size")
                if isinstance(size, int) and size > 0:  # one 16-bit scale per group
                    return Fraction(bits, 8) + Fraction(2, size), f"compressed-tensors {bits}-bit, a scale per {size}"
                return Fraction(bits, 8), f"compressed-tensors {bits}-bit weights"
    raise StudyError(
        f"{where}: quantization_config quant_method {method!r} is not known to the weights "
        "estimate (expected fp8, mxfp4, nvfp4/modelopt_fp4, awq, gptq, bitsandbytes, "
        "compressed-tensors); pass the weights in GiB (--weights-gib)"
    )


def quantization_config(config: dict[str, Any], folder: Path | None = None) -> dict[str, Any] | None:
    """The checkpoint's quantization: ``quantization_config`` at the top or inside ``text_config``, else
    ModelOpt's ``hf_quant_config.json`` next to the config (read as vLLM's modelopt method reads it)."""
    for where in (config, config.get("text_config")):
        quant = where.get("quantization_config") if isinstance(where, dict) else None
        if isinstance(quant, dict) and quant.get("quant_method"):
            return quant
    if folder is not None and (folder / HF_QUANT_CONFIG).is_file():
        data = read_json(folder / HF_QUANT_CONFIG)
        inner = data.get("quantization") if isinstance(data, dict) else None
        if isinstance(inner, dict):
            return {
                "quant_method": "modelopt",
                "quant_algo": inner.get("quant_algo"),
                "ignore": inner.get("exclude_modules") or [],
            }
    return None


def _rules_layout(config: dict[str, Any], where: str, layout: ModelLayout | None) -> ModelLayout:
    """The rules' layout (parameter counts read the config's own fields, not vLLM's cache specs)."""
    if layout is not None and layout.source == KV_RULES_SOURCE:
        return layout
    return layout_from_config(config, where)  # vLLM's specs: never an --assume'd layout (oracle asks none)


def _unconverted(quant: dict[str, Any]) -> set[str]:
    """Parts a quantization_config keeps in 16 bits (modules_to_not_convert / ignore)."""
    names = " ".join(str(n) for n in (quant.get("modules_to_not_convert") or quant.get("ignore") or []))
    kept = set()
    if "attn" in names or "attention" in names:
        kept.add("attention")
    if "mlp" in names and "experts" not in names:
        kept.add("mlp")
    return kept


def estimate_weights(
    config: dict[str, Any], where: str = "config.json", layout: ModelLayout | None = None
) -> WeightsSize:
    """Weight bytes estimated from a config: parameters per part x the bytes the checkpoint stores them in."""
    layout = _rules_layout(config, where, layout)
    parts = parameter_parts(config, where, layout)
    base = DTYPE_BYTES[layout.model_dtype]
    quant = quantization_config(config, Path(where).parent)
    per_part = dict.fromkeys(parts, base)
    label = f"{layout.model_dtype}, {int(base)} bytes per weight"
    if quant:  # always with a quant_method
        per, label = _quantized_bytes(quant, where)
        kept = _unconverted(quant)
        per_part |= dict.fromkeys({"attention", "mlp", "experts"} - kept, per)
        label += "; embeddings, output head and towers 16-bit" + (
            f"; {', '.join(sorted(kept))} 16-bit (modules_to_not_convert)" if kept else ""
        )
    total = sum(int(math.ceil(count * per_part[name])) for name, count in parts.items())
    return WeightsSize(total, f"estimated from config ({label})")


def _header_bytes(files: list[Path]) -> int:
    """Tensor bytes of safetensors files: each file past its header, which safetensors' own reader checks
    the tensors fill exactly (each its shape x dtype), no tensor read."""
    from safetensors import SafetensorError, safe_open

    total = 0
    for path in files:
        try:
            with safe_open(path, "numpy"), path.open("rb") as fh:
                total += path.stat().st_size - 8 - int.from_bytes(fh.read(8), "little")
        except (SafetensorError, OSError) as exc:
            raise StudyError(f"{path}: not a readable safetensors file ({exc})") from None
    return total


def weights_size(model: str | Path, layout: ModelLayout | None = None, given: float | None = None) -> WeightsSize:
    """Weight bytes: ``given`` (bytes) when given, else the index's total_size, else the safetensors headers,
    else an estimate from the config."""
    if given is not None:
        return WeightsSize(int(given), "given")
    config, cfg_path = load_config(model)
    folder = cfg_path.parent
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index)
        total = (data.get("metadata") or {}).get("total_size") if isinstance(data, dict) else None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise StudyError(f"{index}: field 'metadata.total_size' is {total!r} (expected a positive integer)")
        return WeightsSize(total, "safetensors index total_size")
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return WeightsSize(_header_bytes(files), f"safetensors headers ({len(files)} file(s))")
    try:
        return estimate_weights(config, str(cfg_path), layout)
    except StudyError as exc:  # the estimate's own one-line error, marked as "weights unknown"
        raise WeightsUnknown(str(exc)) from None
