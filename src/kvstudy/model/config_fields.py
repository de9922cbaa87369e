"""Which fields of a config.json the KV rules read, and which they leave unread (for a refusal or an
``--assume`` warning that names them)."""

from __future__ import annotations

from typing import Any

# Fields that do not change the KV layout (checked by name or by these endings), left out of the
# "fields not understood" list of a refusal or an --assume warning.
NEUTRAL_FIELDS = frozenset(
    "architectures model_type torch_dtype dtype transformers_version use_cache tie_word_embeddings vocab_size "
    "hidden_size hidden_act hidden_activation initializer_range max_position_embeddings num_hidden_layers "
    "num_attention_heads num_key_value_heads head_dim intermediate_size auto_map quantization_config "
    "text_config vision_config audio_config bias attention_bias mlp_bias tokenizer_class pretraining_tp "
    "kv_lora_rank q_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim".split()
)
NEUTRAL_PARTS = (
    "token_id",
    "rope",
    "dropout",
    "eps",
    "expert",
    "moe",
    "router",
    "routed",
    "topk",
    "_group",
    "scaling",
    "softcap",
    "logit",
    "norm",
    "init",
    "output_",
    "aux_loss",
    "_act",
    "mlp",
    "ffn",
)


def unread_fields(cfg: dict[str, Any]) -> list[str]:
    """Fields of a config that may shape its KV cache and that no rule here reads (at most 12)."""
    names = [str(k) for k in cfg if str(k) not in NEUTRAL_FIELDS and not any(part in str(k) for part in NEUTRAL_PARTS)]
    return names[:12] + ([f"... {len(names) - 12} more"] if len(names) > 12 else [])
