"""KV-cache capacity math: bytes per token and per request, tokens per GiB, the pool a GPU leaves.

Everything here is computed from a model's ``config.json`` with the per-layer rules of vLLM
0.32 (``vllm/v1/kv_cache_interface.py`` and ``vllm/v1/core/kv_cache_utils.py``):

* full attention (MHA/GQA): ``num_kv_heads * (head_size + head_size_v) * dtype_bytes`` per token
  per layer; the cost grows with every token;
* MLA (DeepSeek-V2/V3, Kimi-K2): one latent of ``kv_lora_rank + qk_rope_head_dim`` values per
  token per layer and no V; the special dtypes ``fp8_ds_mla`` and ``nvfp4_ds_mla`` cost a fixed
  656 and 352 bytes per token per layer;
* sliding-window layers: the same per-token cost, but a request holds at most the window;
* linear-attention / Mamba layers (Qwen3-Next): a fixed state per request, whatever its length.

How vLLM's block allocator turns KV memory into the logged pool is in ``kvstudy.model.allocator``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.model.folder import is_finite_number, load_config, read_json
from kvstudy.vllm.facts import DTYPE_BYTES, MLA_SPECIAL_BYTES

GIB = 1024**3
KIB = 1024

KV_DTYPES: tuple[str, ...] = ("auto", *DTYPE_BYTES, *MLA_SPECIAL_BYTES)

FULL = "full_attention"
SLIDING = "sliding_attention"
MLA = "mla"
LINEAR = "linear_attention"
LAYER_KINDS = (FULL, SLIDING, MLA, LINEAR)

# Values of `layer_types` in Hugging Face configs, mapped to the kinds above.
LAYER_TYPE_NAMES: dict[str, str] = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "linear_attention": LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
}

# model_type values whose KV layout this module knows (checked against each family's config).
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss", "deepseek_v2", "deepseek_v3",
    "kimi_k2", "phi3", "granite", "olmo2", "starcoder2",
})


# Fields a family's config may leave out, with the default its transformers config class applies.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"sliding_window_pattern": 6, "max_position_embeddings": 131072,
                    "vocab_size": 262208, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
}


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class LayerSpec:
    """The KV cache one decoder layer keeps."""

    index: int
    kind: str                      # one of LAYER_KINDS
    num_kv_heads: int = 0          # KV heads (1 for MLA's latent, 0 for a state layer)
    head_size: int = 0             # values per head for K (the latent size for MLA)
    head_size_v: int = 0           # values per head for V (0 for MLA)
    sliding_window: int | None = None
    state_values: tuple[int, ...] = ()   # linear layers: element count of each state tensor

    @property
    def values_per_token(self) -> int:
        """K and V values one token adds to this layer (0 for a state layer)."""
        return self.num_kv_heads * (self.head_size + self.head_size_v)


@dataclass(frozen=True)
class ModelLayout:
    """What the capacity math needs from a config.json."""

    name: str                      # folder name
    config_path: str
    model_type: str
    architecture: str
    model_dtype: str               # bfloat16 / float16, the dtype "auto" resolves to
    layers: tuple[LayerSpec, ...]
    max_position_embeddings: int | None
    kv_scheme_dtype: str | None = None   # a checkpoint-level KV dtype (compressed-tensors kv_cache_scheme)

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers if layer.kind == kind)

    @property
    def layer_kinds(self) -> dict[str, int]:
        counts = Counter(layer.kind for layer in self.layers)
        return {kind: counts[kind] for kind in LAYER_KINDS if counts[kind]}

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        return tuple(sorted({l.sliding_window for l in self.layers if l.sliding_window}))


@dataclass(frozen=True)
class KVFootprint:
    """KV bytes for one model and one KV dtype."""

    model: str
    kv_dtype: str                  # as asked (may be "auto")
    resolved_dtype: str            # what the attention layers store
    bytes_per_token: float         # what one more token adds in a long context (growing layers only)
    bytes_per_token_short: float   # what one token adds while every sliding window is still open
    state_bytes_per_request: int   # fixed state of linear-attention layers, per request
    context_len: int
    bytes_per_request: float       # a request of context_len tokens, all layer kinds
    layer_kinds: dict[str, int]
    skip_layers: str | None = None

    @property
    def kib_per_token(self) -> float:
        return self.bytes_per_token / KIB

    @property
    def tokens_per_gib(self) -> float:
        return tokens_per_gib(self.bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kib_per_token"] = self.kib_per_token
        out["tokens_per_gib"] = self.tokens_per_gib
        return out


@dataclass(frozen=True)
class PoolEstimate:
    """The KV pool a GPU leaves at a memory utilization, after weights and overhead."""

    gpu_memory_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int           # gpu_memory_bytes * utilization
    weights_bytes: int
    overhead_bytes: int            # activations, non-torch memory, CUDA graphs (an assumption)
    kv_pool_bytes: int             # what is left for the KV cache (0 if nothing)
    fixed_pool_tokens: int | None = None

    @property
    def kv_pool_gib(self) -> float:
        return self.kv_pool_bytes / GIB


@dataclass(frozen=True)
class WeightsSize:
    """Weight memory of a checkpoint and where the figure came from."""

    bytes: int
    source: str                    # "safetensors index total_size" or "estimated from config"
    parameters: int | None = None


# --------------------------------------------------------------------------- reading configs

def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: ``text_config`` when nested, else the config."""
    text = config.get("text_config")
    merged = dict(config)
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
        merged.update(text)
    for key, value in FAMILY_DEFAULTS.get(str(merged.get("model_type")), {}).items():
        merged.setdefault(key, value)
    return merged


def _positive_int(cfg: dict[str, Any], key: str, where: str, required: bool = True) -> int | None:
    value = cfg.get(key)
    if value is None:
        if required:
            raise StudyError(f"{where}: missing field '{key}' (expected a positive integer)")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise StudyError(f"{where}: field '{key}' is {value!r} (expected a positive integer)")
    return value


def _model_dtype(cfg: dict[str, Any], where: str) -> str:
    """The dtype vLLM serves the model in with ``--dtype auto`` (and so what KV 'auto' stores)."""
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    if value is None:
        return "bfloat16"  # vLLM reads a missing torch_dtype as float32 and serves it in bfloat16
    text = str(value).removeprefix("torch.")
    if text in ("bfloat16", "float16"):
        return text
    if text == "float32":
        return "bfloat16"  # vLLM serves float32 checkpoints in bfloat16 by default
    raise StudyError(f"{where}: field 'torch_dtype' is {value!r} (expected bfloat16, float16 or float32)")


def _model_type(cfg: dict[str, Any], where: str) -> tuple[str, str]:
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise StudyError(f"{where}: missing field 'model_type' (expected e.g. 'qwen3', 'llama', 'gemma3')")
    if model_type not in SUPPORTED_MODEL_TYPES:
        known = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise StudyError(f"{where}: unknown architecture, field 'model_type' is {model_type!r} "
                         f"(architectures {archs!r}); this module knows: {known}")
    return model_type, arch or model_type


def _layer_kinds(cfg: dict[str, Any], model_type: str, num_layers: int, where: str) -> list[str]:
    """Kind of each layer, from `layer_types` or the family's own pattern fields."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise StudyError(f"{where}: field 'layer_types' must list {num_layers} layer kinds "
                             f"(num_hidden_layers), got {len(layer_types) if isinstance(layer_types, list) else layer_types!r}")
        kinds = []
        for i, name in enumerate(layer_types):
            if name not in LAYER_TYPE_NAMES:
                raise StudyError(f"{where}: field 'layer_types[{i}]' is {name!r} "
                                 f"(expected one of {', '.join(LAYER_TYPE_NAMES)})")
            kinds.append(LAYER_TYPE_NAMES[name])
        return kinds
    if model_type == "qwen3_next":
        interval = _positive_int(cfg, "full_attention_interval", where)
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    window = cfg.get("sliding_window")
    if model_type in ("gemma3", "gemma3_text"):
        pattern = _positive_int(cfg, "sliding_window_pattern", where)
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    if model_type in ("gemma2", "gpt_oss"):
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if window and cfg.get("use_sliding_window", True) is not False:
        return [SLIDING] * num_layers  # e.g. Mistral-7B-v0.1: every layer slides
    return [FULL] * num_layers


def _attention_shape(cfg: dict[str, Any], where: str) -> tuple[int, int]:
    """(num_kv_heads, head_dim) of a standard attention layer."""
    heads = _positive_int(cfg, "num_attention_heads", where)
    kv_heads = _positive_int(cfg, "num_key_value_heads", where, required=False) or heads
    head_dim = _positive_int(cfg, "head_dim", where, required=False)
    if head_dim is None:
        hidden = _positive_int(cfg, "hidden_size", where)
        if hidden % heads:
            raise StudyError(f"{where}: field 'hidden_size' {hidden} is not a multiple of "
                             f"'num_attention_heads' {heads} and there is no 'head_dim'")
        head_dim = hidden // heads
    return kv_heads, head_dim


def _linear_state_values(cfg: dict[str, Any], where: str) -> tuple[int, ...]:
    """Element counts of a gated-delta-net layer's conv and recurrent states (vLLM mamba_utils)."""
    k_heads = _positive_int(cfg, "linear_num_key_heads", where)
    v_heads = _positive_int(cfg, "linear_num_value_heads", where)
    k_dim = _positive_int(cfg, "linear_key_head_dim", where)
    v_dim = _positive_int(cfg, "linear_value_head_dim", where)
    kernel = _positive_int(cfg, "linear_conv_kernel_dim", where)
    conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
    return (conv_dim * (kernel - 1), v_heads * v_dim * k_dim)


def layout_from_config(config: dict[str, Any], where: str = "config.json") -> ModelLayout:
    """Turn a parsed config.json into the per-layer KV layout (no file access)."""
    cfg = _text_config(config)
    model_type, arch = _model_type(cfg, where)
    num_layers = _positive_int(cfg, "num_hidden_layers", where)
    dtype = _model_dtype(cfg, where)
    kinds = _layer_kinds(cfg, model_type, num_layers, where)
    layers: list[LayerSpec] = []
    if cfg.get("kv_lora_rank") is not None:
        rank = _positive_int(cfg, "kv_lora_rank", where)
        rope = _positive_int(cfg, "qk_rope_head_dim", where)
        layers = [LayerSpec(i, MLA, 1, rank + rope, 0) for i in range(num_layers)]
    else:
        kv_heads, head_dim = (0, 0)
        if any(k != LINEAR for k in kinds):
            kv_heads, head_dim = _attention_shape(cfg, where)
        window = None
        if SLIDING in kinds:
            window = _positive_int(cfg, "sliding_window", where)
        state = _linear_state_values(cfg, where) if LINEAR in kinds else ()
        for i, kind in enumerate(kinds):
            if kind == LINEAR:
                layers.append(LayerSpec(i, LINEAR, state_values=state))
            else:
                layers.append(LayerSpec(i, kind, kv_heads, head_dim, head_dim,
                                        window if kind == SLIDING else None))
    max_pos = cfg.get("max_position_embeddings")
    name = Path(where).parent.name or Path(where).stem
    return ModelLayout(name=name, config_path=str(where), model_type=model_type, architecture=arch,
                       model_dtype=dtype, layers=tuple(layers),
                       max_position_embeddings=max_pos if isinstance(max_pos, int) else None,
                       kv_scheme_dtype=_kv_scheme_dtype(config))


def _kv_scheme_dtype(config: dict[str, Any]) -> str | None:
    """fp8 when the checkpoint's config declares an 8-bit float KV scheme (compressed-tensors)."""
    quant = config.get("quantization_config")
    scheme = quant.get("kv_cache_scheme") if isinstance(quant, dict) else None
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "fp8"
    return None


def load_layout(model: str | Path | ModelLayout) -> ModelLayout:
    """The KV layout of a model folder, a config.json, or a cached Hugging Face id."""
    if isinstance(model, ModelLayout):
        return model
    config, path = load_config(model)
    return layout_from_config(config, str(path))


# --------------------------------------------------------------------------- bytes per token

def resolve_kv_dtype(layout: ModelLayout, kv_dtype: str) -> str:
    """The dtype the attention layers store for a --kv-cache-dtype value."""
    if kv_dtype not in KV_DTYPES:
        raise StudyError(f"kv dtype {kv_dtype!r}: unknown (expected one of {', '.join(KV_DTYPES)})")
    if kv_dtype == "auto":
        return layout.kv_scheme_dtype or layout.model_dtype
    if kv_dtype in MLA_SPECIAL_BYTES and not any(l.kind == MLA for l in layout.layers):
        raise StudyError(f"kv dtype {kv_dtype!r}: only for MLA models, and {layout.config_path} has no MLA layers")
    return kv_dtype


def _skipped(layer: LayerSpec, skip_layers: str | None) -> bool:
    """Whether --kv-cache-dtype-skip-layers keeps this layer in the model dtype."""
    if not skip_layers:
        return False
    for item in str(skip_layers).split(","):
        item = item.strip()
        if item == "sliding_window" and layer.kind == SLIDING:
            return True
        if item.isdigit() and int(item) == layer.index:
            return True
    return False


def _check_skip_layers(skip_layers: str | None) -> None:
    if not skip_layers:
        return
    for item in str(skip_layers).split(","):
        if item.strip() != "sliding_window" and not item.strip().isdigit():
            raise StudyError(f"skip layers {skip_layers!r}: expected 'sliding_window' or comma-separated layer indices")


def layer_bytes_per_token(layer: LayerSpec, dtype: str, model_dtype: str,
                          skip_layers: str | None = None) -> Fraction:
    """KV bytes one token costs in one layer (0 for a linear-attention layer)."""
    if layer.kind == LINEAR:
        return Fraction(0)
    if _skipped(layer, skip_layers):
        dtype = model_dtype
    if layer.kind == MLA and dtype in MLA_SPECIAL_BYTES:
        return Fraction(MLA_SPECIAL_BYTES[dtype])
    return layer.values_per_token * DTYPE_BYTES[dtype]


def state_bytes(layer: LayerSpec, model_dtype: str) -> int:
    """A linear-attention layer's fixed state per request (conv and recurrent state in the model dtype)."""
    return int(sum(layer.state_values) * DTYPE_BYTES[model_dtype])


def kv_footprint(model: str | Path | ModelLayout, kv_dtype: str = "auto", context_len: int | None = None,
                 skip_layers: str | None = None) -> KVFootprint:
    """Bytes per token (long context), per token (short context) and per request of ``context_len``."""
    layout = load_layout(model)
    _check_skip_layers(skip_layers)
    dtype = resolve_kv_dtype(layout, kv_dtype)
    length = context_len if context_len is not None else (layout.max_position_embeddings or 0)
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise StudyError(f"context length {length!r}: expected a positive integer "
                         f"({layout.config_path} has no max_position_embeddings to default to)")
    growing = short = per_request = Fraction(0)
    state = 0
    for layer in layout.layers:
        per_token = layer_bytes_per_token(layer, dtype, layout.model_dtype, skip_layers)
        short += per_token
        if layer.kind == LINEAR:
            state += state_bytes(layer, layout.model_dtype)
        elif layer.kind == SLIDING:
            per_request += per_token * min(length, layer.sliding_window or length)
        else:
            growing += per_token
            per_request += per_token * length
    return KVFootprint(model=layout.name, kv_dtype=kv_dtype, resolved_dtype=dtype,
                       bytes_per_token=_plain(growing), bytes_per_token_short=_plain(short),
                       state_bytes_per_request=state, context_len=length,
                       bytes_per_request=_plain(per_request + state), layer_kinds=layout.layer_kinds,
                       skip_layers=skip_layers)


def _plain(value: Fraction) -> int | float:
    """An int when the value is whole (so JSON shows 147456, not 147456.0), else a float."""
    return int(value) if value.denominator == 1 else float(value)


def tokens_per_gib(bytes_per_token: float) -> float:
    """KV tokens one GiB holds at a cost per token."""
    if bytes_per_token <= 0:
        raise StudyError(f"bytes per token {bytes_per_token!r}: expected a positive number")
    return GIB / bytes_per_token


# --------------------------------------------------------------------------- weights and pool

def weights_size(model: str | Path, layout: ModelLayout | None = None) -> WeightsSize:
    """Weight bytes: the safetensors index ``metadata.total_size`` when present, else an estimate."""
    config, cfg_path = load_config(model)
    index = cfg_path.parent / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index)
        total = (data.get("metadata") or {}).get("total_size") if isinstance(data, dict) else None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise StudyError(f"{index}: field 'metadata.total_size' is {total!r} (expected a positive integer)")
        return WeightsSize(total, "safetensors index total_size")
    layout = layout or layout_from_config(config, str(cfg_path))
    params = estimate_parameters(config, str(cfg_path))
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8":
        return WeightsSize(params, "estimated from config (fp8 weights, 1 byte per parameter)", params)
    return WeightsSize(int(params * DTYPE_BYTES[layout.model_dtype]), "estimated from config", params)


def estimate_parameters(config: dict[str, Any], where: str = "config.json") -> int:
    """Parameter count of a standard decoder (dense or MoE, GQA or MLA) from its config.

    An estimate: biases and norms are left out, and quantized checkpoints are counted as if
    every weight had the model dtype.
    """
    cfg = _text_config(config)
    layout = layout_from_config(config, where)
    hidden = _positive_int(cfg, "hidden_size", where)
    vocab = _positive_int(cfg, "vocab_size", where)
    heads = _positive_int(cfg, "num_attention_heads", where)
    total = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    for layer in layout.layers:
        total += _attention_parameters(cfg, layer, hidden, heads, where)
        total += _mlp_parameters(cfg, layer.index, hidden, where)
    return total


def _attention_parameters(cfg: dict[str, Any], layer: LayerSpec, hidden: int, heads: int, where: str) -> int:
    need = lambda key: _positive_int(cfg, key, where)  # noqa: E731 - a required positive field
    if layer.kind == LINEAR:
        key = need("linear_num_key_heads") * need("linear_key_head_dim")
        value = need("linear_num_value_heads") * need("linear_value_head_dim")
        return hidden * (2 * key + 2 * value) + hidden * 2 * need("linear_num_value_heads") + value * hidden
    if layer.kind == MLA:
        q_rank = _positive_int(cfg, "q_lora_rank", where, required=False)
        qk_dim = need("qk_nope_head_dim") + need("qk_rope_head_dim")
        q = hidden * heads * qk_dim if not q_rank else hidden * q_rank + q_rank * heads * qk_dim
        kv = hidden * (need("kv_lora_rank") + need("qk_rope_head_dim"))
        kv += need("kv_lora_rank") * heads * (need("qk_nope_head_dim") + need("v_head_dim"))
        return q + kv + heads * need("v_head_dim") * hidden
    q_dim = heads * layer.head_size
    return hidden * q_dim + 2 * hidden * layer.num_kv_heads * layer.head_size + q_dim * hidden


def _mlp_parameters(cfg: dict[str, Any], index: int, hidden: int, where: str) -> int:
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    dense_first = cfg.get("first_k_dense_replace") or 0
    if experts and index >= dense_first:
        key = "moe_intermediate_size" if cfg.get("moe_intermediate_size") is not None else "intermediate_size"
        expert_size = _positive_int(cfg, key, where)
        shared = cfg.get("n_shared_experts") or 0
        shared_size = cfg.get("shared_expert_intermediate_size") or shared * expert_size
        return 3 * hidden * expert_size * experts + 3 * hidden * shared_size + hidden * experts
    return 3 * hidden * _positive_int(cfg, "intermediate_size", where)


def kv_pool_after_weights(gpu_memory_gib: float, gpu_memory_utilization: float, weights_bytes: int,
                          overhead_gib: float = 0.0, fixed_pool_tokens: int | None = None) -> PoolEstimate:
    """KV pool = GPU memory x utilization - weights - overhead (the overhead is an assumption)."""
    if not is_finite_number(gpu_memory_gib) or gpu_memory_gib <= 0:
        raise StudyError(f"gpu_memory_gib {gpu_memory_gib!r}: expected a positive number of GiB")
    if not is_finite_number(gpu_memory_utilization) or not 0 < gpu_memory_utilization <= 1:
        raise StudyError(f"gpu_memory_utilization {gpu_memory_utilization!r}: expected a number in (0, 1]")
    if not is_finite_number(overhead_gib) or overhead_gib < 0:
        raise StudyError(f"overhead_gib {overhead_gib!r}: expected a number of GiB >= 0")
    total = int(gpu_memory_gib * GIB)
    requested = int(total * gpu_memory_utilization)
    overhead = int(overhead_gib * GIB)
    pool = max(requested - int(weights_bytes) - overhead, 0)
    return PoolEstimate(total, gpu_memory_utilization, requested, int(weights_bytes), overhead, pool,
                        fixed_pool_tokens)


def users_that_fit(pool_bytes: float, footprint: KVFootprint) -> int:
    """Whole requests of ``footprint.context_len`` tokens a pool holds at once."""
    if footprint.bytes_per_request <= 0:
        return 0
    return int(pool_bytes // footprint.bytes_per_request)


# --------------------------------------------------------------------------- tables and CLI

def default_dtypes(layout: ModelLayout) -> list[str]:
    """The model's own 16-bit dtype, fp8 and nvfp4 (MLA models: their own fp8/nvfp4 formats)."""
    if any(l.kind == MLA for l in layout.layers):
        return [layout.model_dtype, "fp8", "fp8_ds_mla", "nvfp4_ds_mla"]
    return [layout.model_dtype, "fp8", "nvfp4"]


def capacity_summary(model: str | Path, kv_dtypes: list[str] | None = None, context_len: int | None = None,
                     skip_layers: str | None = None) -> dict[str, Any]:
    """The CLI's JSON object: the model's layer kinds and, per dtype, the footprint figures."""
    layout = load_layout(model)
    dtypes = kv_dtypes or default_dtypes(layout)
    result: dict[str, Any] = {
        "model": layout.name,
        "config": layout.config_path,
        "model_type": layout.model_type,
        "architecture": layout.architecture,
        "model_dtype": layout.model_dtype,
        "layer_kinds": layout.layer_kinds,
        "sliding_windows": list(layout.sliding_windows),
        "skip_layers": skip_layers,
        "dtypes": {},
    }
    for dtype in dtypes:
        fp = kv_footprint(layout, dtype, context_len, skip_layers)
        result["context_len"] = fp.context_len
        result["dtypes"][dtype] = {
            "resolved_dtype": fp.resolved_dtype,
            "bytes_per_token": fp.bytes_per_token,
            "kib_per_token": fp.kib_per_token,
            "tokens_per_gib": fp.tokens_per_gib if fp.bytes_per_token else None,
            "bytes_per_token_short_context": fp.bytes_per_token_short,
            "state_bytes_per_request": fp.state_bytes_per_request,
            "bytes_per_request": fp.bytes_per_request,
        }
    return result


def footprint_table(model: str | Path | ModelLayout, kv_dtypes: list[str], context_len: int,
                    skip_layers: str | None = None) -> Any:
    """One row per KV dtype: bytes and KiB per token, tokens per GiB, MiB per request (a DataFrame)."""
    import pandas as pd

    rows = []
    for dtype in kv_dtypes:
        fp = kv_footprint(model, dtype, context_len, skip_layers)
        rows.append({"kv dtype": dtype, "stored as": fp.resolved_dtype,
                     "bytes per token": fp.bytes_per_token, "KiB per token": fp.kib_per_token,
                     "tokens per GiB": fp.tokens_per_gib if fp.bytes_per_token else float("nan"),
                     "fixed state per request (MiB)": fp.state_bytes_per_request / 2**20,
                     f"MiB per {context_len:,}-token request": fp.bytes_per_request / 2**20})
    return pd.DataFrame(rows).set_index("kv dtype")


def compare_models(models: list[str | Path], context_len: int,
                   dtypes: tuple[str, str] = ("auto", "fp8")) -> Any:
    """One row per model: layer kinds and, for two KV dtypes, KiB per token and tokens per GiB."""
    import pandas as pd

    rows = []
    for model in models:
        layout = load_layout(model)
        kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in layout.layer_kinds.items())
        windows = ", ".join(str(w) for w in layout.sliding_windows)
        row: dict[str, Any] = {"model": layout.name, "layers": kinds + (f" (window {windows})" if windows else "")}
        for dtype in dtypes:
            fp = kv_footprint(layout, dtype, context_len)
            label = fp.resolved_dtype if dtype == "auto" else dtype
            row[f"KiB/token {label if dtype != 'auto' else '16-bit'}"] = fp.kib_per_token
            row[f"tokens/GiB {label if dtype != 'auto' else '16-bit'}"] = fp.tokens_per_gib
            row[f"MiB/request {label if dtype != 'auto' else '16-bit'}"] = fp.bytes_per_request / 2**20
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def _format_table(summary: dict[str, Any]) -> str:
    kinds = ", ".join(f"{n} {k}" for k, n in summary["layer_kinds"].items())
    lines = [f"{summary['model']} ({summary['model_type']}, {kinds}); request of "
             f"{summary['context_len']:,} tokens" + (f"; skip layers {summary['skip_layers']}"
                                                    if summary["skip_layers"] else ""),
             f"{'kv dtype':<14}{'bytes/token':>14}{'KiB/token':>11}{'tokens/GiB':>12}{'MiB/request':>13}"]
    for name, row in summary["dtypes"].items():
        per_gib = f"{row['tokens_per_gib']:,.0f}" if row["tokens_per_gib"] else "-"
        lines.append(f"{name:<14}{row['bytes_per_token']:>14,.0f}{row['kib_per_token']:>11,.2f}"
                     f"{per_gib:>12}{row['bytes_per_request'] / 2**20:>13,.1f}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    summary = capacity_summary(args.path, args.kv_dtype, args.max_model_len, args.skip_layers)
    print(json.dumps(summary, indent=2) if args.json else _format_table(summary))
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy capacity PATH [--kv-dtype D ...] [--max-model-len N] [--skip-layers S] [--json]``."""
    parser = subparsers.add_parser("capacity", help="KV bytes per token and per request from a config.json",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="model folder, its config.json, or a cached Hugging Face id")
    parser.add_argument("--kv-dtype", nargs="+", metavar="D",
                        help=f"KV dtypes (default: the model's dtype, fp8, nvfp4); one of {', '.join(KV_DTYPES)}")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="tokens in one request (default: the config's max_position_embeddings)")
    parser.add_argument("--skip-layers", default=None,
                        help="'sliding_window' (or layer indices): layers kept in the model dtype")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_run)
