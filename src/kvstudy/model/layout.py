"""A model's KV layout from its ``config.json``: one record per cache a layer keeps.

The per-family rules follow vLLM 0.32's model files (named at each rule) and
``vllm/v1/kv_cache_interface.py``. An unknown ``model_type`` is refused with a message naming
``assume``: the caller may then read the config with a known family's rules, and the layout carries
a warning saying so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.limits import MAX_LAYERS
from kvstudy.model.config_fields import (
    checkpoint_kv_dtype,
    config_int,
    load_config,
    model_dtype,
    named_items,
    nemotron_h_pattern,
    text_config,
    unread_fields,
    usable_int,
)
from kvstudy.vllm.facts import INDEXER_QUANT_BLOCK, INDEXER_SCALE_BYTES, KV_RULES_SOURCE, NEMOTRON_H_SSM_STATE_DTYPE

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_local_attention"
MLA = "mla"
LINEAR = "linear_attention"  # any fixed-state layer (gated delta net, Mamba-1/2)
SHARED = "kv_shared"  # reads another layer's KV, stores nothing
INDEXER = "indexer"  # sparse MLA's lightning-indexer keys: one fixed-size uint8 vector per token
LAYER_KINDS = (FULL, SLIDING, CHUNKED, MLA, INDEXER, LINEAR, SHARED)


# Values of `layer_types` in Hugging Face configs, mapped to the kinds above.
LAYER_TYPE_NAMES: dict[str, str] = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
}

# Families read with the plain GQA / MLA / window rules (checked against each family's config); qwen2_5_vl
# (qwen2_5_vl.py) is the Qwen2 language model, plain GQA (text_config or top level).
PLAIN_MODEL_TYPES = frozenset(
    "llama mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma gemma2 gemma3 gemma3_text gpt_oss "
    "deepseek_v2 deepseek_v3 kimi_k2 phi3 granite olmo2 starcoder2 glm4_moe minimax_m2 qwen3_vl qwen3_vl_text "
    "kimi_k25 qwen2_5_vl qwen2_5_vl_text".split()
)
GDN_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
# Families with their own layer rules in this module.
SPECIAL_MODEL_TYPES = GDN_MODEL_TYPES | frozenset(
    "llama4 llama4_text gemma3n gemma3n_text granitemoehybrid nemotron_h falcon_h1 jamba gemma4 gemma4_text "
    "mimo_v2_flash nemotron-nas deepseek_v32 glm_moe_dsa".split()
)
# Sparse MLA with a lightning indexer (vllm/models/deepseek_v32: DeepSeek-V3.2 and GLM-5's glm_moe_dsa;
# vllm/model_executor/models/deepseek_v2.py is_v32 = hasattr(config, "index_topk")).
DSA_MODEL_TYPES = frozenset({"deepseek_v32", "glm_moe_dsa", "deepseek_v3"})
# Fields of layer kinds the rules do not model: a config with one is refused (vLLM's specs, where vLLM
# can build the model, are the only source for it).
UNMODELLED_FIELDS = ("index_topk", "compress_rates", "compress_rate_csa", "compress_ratios", "hc_mult")
SUPPORTED_MODEL_TYPES: frozenset[str] = PLAIN_MODEL_TYPES | SPECIAL_MODEL_TYPES


@dataclass(frozen=True)
class StateShape:
    """A fixed-state layer's shape parameters (vLLM ``MambaStateShapeCalculator``)."""

    kind: str  # "gdn" (Qwen3-Next), "mamba2" or "mamba1"
    conv_dim: int  # channels of the conv state at TP 1
    conv_kernel: int
    heads: int  # SSM / value heads (mamba1: the intermediate size)
    head_dim: int  # mamba1: 1
    state_size: int
    n_groups: int = 0  # mamba2: B/C groups (part of conv_dim)
    intermediate: int = 0  # mamba2: the x part of conv_dim
    by_tp: tuple[tuple[int, tuple[int, ...]], ...] = ()  # kind "specs": element counts per TP, from vLLM

    def values(self, tp: int = 1) -> tuple[int, ...]:
        """(conv state, temporal state) element counts on one GPU at tensor parallelism ``tp``."""
        if self.kind == "specs":
            found = dict(self.by_tp).get(tp)
            if found is None:
                raise StudyError(f"TP {tp}: vLLM's specs of this state layer were not read at this size")
            return found
        if self.kind == "mamba2":
            groups = self.n_groups if self.n_groups % tp == 0 else tp  # extra_groups_for_head_shards
            conv = (self.intermediate + 2 * groups * self.state_size) // tp
            return conv * (self.conv_kernel - 1), (self.heads // tp) * self.head_dim * self.state_size
        return (self.conv_dim // tp) * (self.conv_kernel - 1), (self.heads // tp) * self.head_dim * self.state_size


@dataclass(frozen=True)
class LayerSpec:
    """The KV cache (or state) one decoder layer keeps."""

    index: int
    kind: str  # one of LAYER_KINDS
    num_kv_heads: int = 0  # KV heads (1 for MLA's latent, 0 for a state layer)
    head_size: int = 0  # values per head for K (the latent size for MLA)
    head_size_v: int = 0  # values per head for V (0 for MLA)
    sliding_window: int | None = None  # window (sliding) or attention_chunk_size (chunked), tokens
    state: StateShape | None = None  # fixed-state layers
    state_dtypes: tuple[str | None, ...] = (None, None)  # conv / temporal; None: model dtype
    stored_bytes: int = 0  # bytes per value whatever --kv-cache-dtype says (the indexer's uint8); 0: the KV dtype


@dataclass(frozen=True)
class ModelLayout:
    """What the capacity math needs from a config.json."""

    name: str  # folder name
    config_path: str
    model_type: str
    architecture: str
    model_dtype: str  # bfloat16 / float16, the dtype "auto" resolves to
    layers: tuple[LayerSpec, ...]
    max_position_embeddings: int | None
    kv_scheme_dtype: str | None = None  # what the checkpoint makes 'auto' store (checkpoint_kv_dtype)
    kv_scheme_source: str | None = None  # the file and field that chose it
    warnings: tuple[str, ...] = ()  # e.g. a family assumed for an unknown model_type
    num_hidden_layers: int = 0  # decoder layers (some keep no cache: Nemotron-H MLP layers)
    notes: tuple[str, ...] = ()  # per-family facts worth showing (MTP layers not served, ...)
    source: str = KV_RULES_SOURCE  # which path produced the layers: vLLM's specs or the project's rules
    tp_refused: tuple[tuple[int, str], ...] = ()  # (TP size, vLLM's reason) for sizes vLLM refuses

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers if layer.kind == kind)

    @property
    def layer_kinds(self) -> dict[str, int]:
        """Layers per kind, in LAYER_KINDS order, kinds present only."""
        counts = Counter(layer.kind for layer in self.layers)
        return {kind: counts[kind] for kind in LAYER_KINDS if counts[kind]}

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        """Distinct windows of sliding-window layers, tokens."""
        return tuple(sorted({l.sliding_window for l in self.layers if l.kind == SLIDING and l.sliding_window}))

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Distinct attention_chunk_size values of chunked local layers, tokens."""
        return tuple(sorted({l.sliding_window for l in self.layers if l.kind == CHUNKED and l.sliding_window}))


def _model_type(cfg: dict[str, Any], where: str, assume: str | None) -> tuple[str, str, tuple[str, ...]]:
    """(family whose rules apply, architecture, warnings)."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise StudyError(f"{where}: missing field 'model_type' (expected e.g. 'qwen3', 'llama', 'gemma3')")
    known = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
    if assume is not None and assume not in SUPPORTED_MODEL_TYPES:
        raise StudyError(f"assume {assume!r}: not a known family (expected one of {known})")
    if model_type in SUPPORTED_MODEL_TYPES:
        unmodelled = [f for f in UNMODELLED_FIELDS if cfg.get(f) is not None]
        if model_type in DSA_MODEL_TYPES and cfg.get("kv_lora_rank") is not None:
            unmodelled = [f for f in unmodelled if f != "index_topk"]
        if unmodelled and assume is None:
            raise StudyError(
                f"{where}: the KV rules do not model field(s) {', '.join(unmodelled)} "
                "(sparse or compressed attention with its own index cache); only vLLM's specs can size it"
            )
        return model_type, arch or model_type, ()
    unread = ", ".join(unread_fields(cfg)) or "none"
    if assume is None:
        raise StudyError(
            f"{where}: unknown architecture, field 'model_type' is {model_type!r} (architectures "
            f"{archs!r}); fields the KV rules do not understand: {unread}; "
            f"to override, pass --assume FAMILY (notebook parameter assume_family), FAMILY one of: {known}"
        )
    warning = (
        f"model_type {model_type!r} is not known to this study; its config was read with the rules of "
        f"{assume!r} (--assume), which may not be how vLLM serves it; fields those rules ignored: {unread}"
    )
    return assume, arch or model_type, (warning,)


def _listed(cfg: dict[str, Any], key: str, count: int, what: str, where: str) -> list[Any]:
    """The list field ``key`` of exactly ``count`` items, else one line naming it and what it holds."""
    value = cfg.get(key)
    if not isinstance(value, list) or len(value) != count:
        got = len(value) if isinstance(value, list) else value
        raise StudyError(f"{where}: field '{key}' must list {count} {what}, got {repr(got)[:60]}")
    return value


def layer_kinds(cfg: dict[str, Any], family: str, num_layers: int, where: str) -> list[list[str]]:
    """The cache kinds of each layer (a Falcon-H1 layer has two: attention and Mamba-2)."""
    if family == "mimo_v2_flash":  # mimo_v2.py: hybrid_layer_pattern[i] == 1 is a sliding-window layer
        pattern = _listed(cfg, "hybrid_layer_pattern", num_layers, "values of 0 or 1", where)
        return [[SLIDING if flag == 1 else FULL] for flag in pattern]
    if family == "nemotron-nas":  # nemotron_nas.py: a block whose attention is no_op keeps no cache
        blocks = _listed(cfg, "block_configs", num_layers, "blocks", where)
        return [[] if _nas_attention(b).get("no_op") else [FULL] for b in blocks]
    if family in ("llama4", "llama4_text"):  # llama4.py: RoPE layers chunked local, NoPE (no_rope_layers 0) global
        no_rope = cfg.get("no_rope_layers")
        if not no_rope:  # transformers Llama4TextConfig default: every no_rope_layer_interval-th layer is NoPE
            interval = config_int(cfg, "no_rope_layer_interval", where)
            no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
        no_rope = _listed({"no_rope_layers": no_rope}, "no_rope_layers", num_layers, "values of 0 or 1", where)
        chunked = cfg.get("attention_chunk_size") is not None
        return [[CHUNKED if flag and chunked else FULL] for flag in no_rope]
    if family == "nemotron_h":  # nemotron_h.py: 'M' Mamba-2, '*' attention, '-' MLP and 'E' MoE (no cache)
        return [{"M": [LINEAR], "*": [FULL]}.get(c, []) for c in nemotron_h_pattern(cfg, where)]
    if family == "jamba":  # jamba.py: layer i is attention when i % attn_layer_period == attn_layer_offset
        period = config_int(cfg, "attn_layer_period", where)
        offset = config_int(cfg, "attn_layer_offset", where, low=0)
        return [[FULL if i % period == offset else LINEAR] for i in range(num_layers)]
    if family == "falcon_h1":
        return [[FULL, LINEAR] for _ in range(num_layers)]
    if cfg.get("layer_types") is not None:
        types = _listed(cfg, "layer_types", num_layers, "layer kinds (num_hidden_layers)", where)
        kinds = named_items(types, "layer_types", LAYER_TYPE_NAMES, where)
    elif family in GDN_MODEL_TYPES:
        interval = config_int(cfg, "full_attention_interval", where)
        kinds = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    elif family in ("gemma3", "gemma3_text"):
        period = config_int(cfg, "sliding_window_pattern", where)
        kinds = [FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers)]
    elif family in ("gemma2", "gpt_oss"):
        kinds = [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    elif cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        kinds = [SLIDING] * num_layers  # e.g. Mistral-7B-v0.1: every layer slides
    else:
        kinds = [FULL] * num_layers
    if family in ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text"):
        shared = cfg.get("num_kv_shared_layers") or 0
        kinds = [SHARED if i >= num_layers - shared else k for i, k in enumerate(kinds)]
    return [[k] for k in kinds]


def attention_shape(cfg: dict[str, Any], where: str) -> tuple[int, int]:
    """(num_kv_heads, head_dim) of a standard attention layer."""
    heads = config_int(cfg, "num_attention_heads", where)
    kv_heads = config_int(cfg, "num_key_value_heads", where, default=0) or heads
    head_dim = config_int(cfg, "head_dim", where, default=0)
    if not head_dim:
        hidden = config_int(cfg, "hidden_size", where)
        if hidden % heads:
            raise StudyError(
                f"{where}: field 'hidden_size' {hidden} is not a multiple of "
                f"'num_attention_heads' {heads} and there is no 'head_dim'"
            )
        head_dim = hidden // heads
    return kv_heads, head_dim


def state_shape(cfg: dict[str, Any], family: str, where: str) -> StateShape:
    """A fixed-state layer's shape, from the fields vLLM reads for the family."""
    need = lambda key: config_int(cfg, key, where)  # noqa: E731 - a required positive field
    if family in GDN_MODEL_TYPES:  # qwen3_next.py, qwen3_5.py / mamba_utils.gated_delta_net_state_shape
        k_heads, v_heads = need("linear_num_key_heads"), need("linear_num_value_heads")
        k_dim, v_dim = need("linear_key_head_dim"), need("linear_value_head_dim")
        conv = k_dim * k_heads * 2 + v_dim * v_heads
        return StateShape("gdn", conv, need("linear_conv_kernel_dim"), v_heads, v_dim, k_dim)
    if family == "jamba":  # jamba.py: mamba1_state_shape(expand * hidden, d_state, d_conv)
        inner = need("mamba_expand") * need("hidden_size")
        return StateShape("mamba1", inner, need("mamba_d_conv"), inner, 1, need("mamba_d_state"))
    if family == "nemotron_h":  # nemotron_h.py: intermediate = mamba_num_heads * mamba_head_dim
        heads, head_dim = need("mamba_num_heads"), need("mamba_head_dim")
        groups, state, kernel = need("n_groups"), need("ssm_state_size"), need("conv_kernel")
        inner = heads * head_dim
    else:  # granitemoehybrid.py, falcon_h1.py: intermediate = mamba_expand * hidden (or mamba_d_ssm)
        heads, head_dim = need("mamba_n_heads"), need("mamba_d_head")
        groups, state, kernel = need("mamba_n_groups"), need("mamba_d_state"), need("mamba_d_conv")
        inner = config_int(cfg, "mamba_d_ssm", where, default=0) or int(cfg.get("mamba_expand") or 0) * need(
            "hidden_size"
        )
        if inner <= 0:
            raise StudyError(f"{where}: missing field 'mamba_expand' (expected a positive number)")
    return StateShape("mamba2", inner + 2 * groups * state, kernel, heads, head_dim, state, groups, inner)


def indexer_layers(cfg: dict[str, Any], num_layers: int, where: str) -> list[LayerSpec]:
    """Sparse MLA's indexer caches (vllm/models/deepseek_v32/attention.py, DeepseekV32IndexerCache in
    vllm/model_executor/models/deepseek_v2.py): an MLAAttentionSpec of one uint8 vector per token,
    ``index_head_dim`` fp8 values plus a 4-byte scale per 128 (quant_block_size), on every layer that
    builds an indexer: all but those ``index_topk_pattern`` marks 'S', or without a pattern those where
    ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (deepseek_v2.py DeepseekV2MLAAttention)."""
    head = config_int(cfg, "index_head_dim", where)
    freq = config_int(cfg, "index_topk_freq", where, default=1)
    offset = config_int(cfg, "index_skip_topk_offset", where, low=0, default=2)
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None and not isinstance(pattern, (str, list)):
        raise StudyError(
            f"{where}: field 'index_topk_pattern' is {type(pattern).__name__} (expected a string or a list)"
        )
    size = head + head // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES
    if pattern is None:
        pattern = ["S" if max(i - offset + 1, 0) % freq else "" for i in range(num_layers)]
    kept = [i for i in range(num_layers) if i >= len(pattern) or pattern[i] != "S"]
    return [LayerSpec(i, INDEXER, 1, size, 0, stored_bytes=1) for i in kept]


def _state_dtypes(cfg: dict[str, Any], family: str) -> tuple[str | None, str | None]:
    """(conv, temporal) state dtypes: the model dtype, except Nemotron-H's SSM state in float32
    unless its config says otherwise (vllm/model_executor/models/config.py NemotronHForCausalLMConfig)."""
    if family == "nemotron_h":
        return None, str(cfg.get("mamba_ssm_cache_dtype") or NEMOTRON_H_SSM_STATE_DTYPE)
    if family in GDN_MODEL_TYPES and cfg.get("mamba_ssm_dtype"):  # Qwen3_5ForConditionalGenerationConfig
        return None, str(cfg["mamba_ssm_dtype"])
    return None, None


def _nas_attention(block: Any) -> dict[str, Any]:
    attention = block.get("attention") if isinstance(block, dict) else None
    return attention if isinstance(attention, dict) else {}


def _attention_layer(
    cfg: dict[str, Any], family: str, index: int, kind: str, default: tuple[int, int], where: str
) -> tuple[int, int, int]:
    """(KV heads, K head size, V head size) of one attention layer, where a family varies them per layer."""
    kv_heads, head_dim = default
    if family in ("gemma4", "gemma4_text") and kind == FULL:  # gemma4.py: global layers' own heads
        heads = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
        size = config_int(cfg, "global_head_dim", where, default=head_dim)
        return int(heads or kv_heads), size, size
    if family == "mimo_v2_flash":
        prefix = "swa_" if kind == SLIDING else ""
        heads = config_int(cfg, f"{prefix}num_key_value_heads", where)
        size = config_int(cfg, f"{prefix}head_dim", where)
        return heads, size, config_int(cfg, f"{prefix}v_head_dim", where, default=size)
    if family == "nemotron-nas":
        group = _nas_attention(cfg["block_configs"][index]).get("n_heads_in_group")
        if not isinstance(group, int) or group <= 0:
            raise StudyError(f"{where}: field 'block_configs[{index}].attention.n_heads_in_group' is {group!r}")
        return config_int(cfg, "num_attention_heads", where) // group, head_dim, head_dim
    return kv_heads, head_dim, head_dim


def layout_from_config(config: dict[str, Any], where: str = "config.json", assume: str | None = None) -> ModelLayout:
    """Turn a parsed config.json into the per-layer KV layout (the only file read: ModelOpt's
    hf_quant_config.json beside ``where``, when ``where`` is a file and config.json has no quantization_config)."""
    cfg = text_config(config)
    family, arch, warnings = _model_type(cfg, where, assume)
    if family == "nemotron_h":  # the pattern's length, as transformers 5 derives num_hidden_layers
        num_layers = len(nemotron_h_pattern(cfg, where))
    else:
        num_layers = config_int(cfg, "num_hidden_layers", where, high=MAX_LAYERS)
    dtype = model_dtype(cfg, where)
    kinds = layer_kinds(cfg, family, num_layers, where)
    flat = {k for ks in kinds for k in ks}
    layers: list[LayerSpec] = []
    if cfg.get("kv_lora_rank") is not None:
        rank = config_int(cfg, "kv_lora_rank", where)
        rope = config_int(cfg, "qk_rope_head_dim", where)
        layers = [LayerSpec(i, MLA, 1, rank + rope, 0) for i in range(num_layers)]
        if family in DSA_MODEL_TYPES and cfg.get("index_topk") is not None:
            layers += indexer_layers(cfg, num_layers, where)
            layers.sort(key=lambda layer: (layer.index, layer.kind == INDEXER))
    else:
        kv_heads, head_dim = attention_shape(cfg, where) if flat - {LINEAR} else (0, 0)
        window_key = "sliding_window_size" if cfg.get("sliding_window_size") else "sliding_window"
        window = config_int(cfg, window_key, where) if SLIDING in flat else None
        chunk = config_int(cfg, "attention_chunk_size", where) if CHUNKED in flat else None
        state = state_shape(cfg, family, where) if LINEAR in flat else None
        state_dtypes = _state_dtypes(cfg, family)
        for i, layer_kinds_i in enumerate(kinds):
            for kind in layer_kinds_i:
                if kind == LINEAR:
                    layers.append(LayerSpec(i, LINEAR, state=state, state_dtypes=state_dtypes))
                else:
                    limit = window if kind == SLIDING else chunk if kind == CHUNKED else None
                    heads_i, k_size, v_size = _attention_layer(cfg, family, i, kind, (kv_heads, head_dim), where)
                    layers.append(LayerSpec(i, kind, heads_i, k_size, v_size, limit))
    return new_layout(
        config,
        where,
        architecture=arch,
        model_dtype=dtype,
        layers=tuple(layers),
        warnings=warnings,
        num_hidden_layers=num_layers,
        notes=_family_notes(cfg, family) + (STATE_RESERVE_NOTE,) * any(l.kind == LINEAR for l in layers),
    )


def new_layout(config: dict[str, Any], where: str, **fields: Any) -> ModelLayout:
    """A layout of the config at ``where`` with ``fields``: its name, model type and length limit, and the
    KV dtype the checkpoint chooses (config.json, or the hf_quant_config.json beside a config file)."""
    scheme, source = checkpoint_kv_dtype(config, Path(where).parent if Path(where).is_file() else None)
    cfg = text_config(config)
    return ModelLayout(
        name=Path(where).parent.name or Path(where).stem,
        config_path=str(where),
        model_type=str(cfg.get("model_type")),
        max_position_embeddings=usable_int(cfg.get("max_position_embeddings")),  # else --max-model-len decides
        kv_scheme_dtype=scheme,
        kv_scheme_source=source,
        **fields,
    )


STATE_RESERVE_NOTE = (
    "vLLM 0.32 runs state layers in mamba cache mode 'align' when prefix caching is on, its default "
    "(--no-enable-prefix-caching: 'none'); 'align' reserves two state blocks per request: the users "
    "column counts the state twice, MiB/request once (vllm/model_executor/models/config.py)"
)


def _family_notes(cfg: dict[str, Any], family: str) -> tuple[str, ...]:
    """Facts about the family's layers worth printing next to the figures."""
    notes = []
    mtp = cfg.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and mtp > 0:
        notes.append(
            f"{mtp} MTP layer(s) (num_nextn_predict_layers) are not counted: vLLM builds them only "
            "with speculative decoding (--speculative-config)"
        )
    if family in DSA_MODEL_TYPES and cfg.get("index_topk") is not None:
        notes.append(
            "sparse MLA: each indexer layer also keeps its keys, uint8 at any --kv-cache-dtype (kind 'indexer'); "
            "a quantized --kv-cache-dtype is stored as fp8_ds_mla, 656 B per token per layer, by CUDA's "
            "FLASHMLA_SPARSE backend (vllm/model_executor/layers/attention/mla_attention.py)"
            + (
                "; on Blackwell (SM10x) vLLM makes 'auto' fp8_e4m3 itself (models/config.py)"
                if family == "glm_moe_dsa"
                else ""
            )
        )
    shared = cfg.get("num_kv_shared_layers")
    if family in ("gemma3n", "gemma3n_text") and shared:
        notes.append(f"the last {shared} layers reuse an earlier layer's KV and store nothing (gemma3n.py)")
    return tuple(notes)


def load_layout(model: str | Path | ModelLayout, assume: str | None = None) -> ModelLayout:
    """The KV layout of a model folder, a config.json, or a cached Hugging Face id."""
    if isinstance(model, ModelLayout):
        return model
    config, path = load_config(model)
    return layout_from_config(config, str(path), assume)
