"""The families issue 12 adds, each against per-layer values computed by hand in the test.

The configs are built here from the fields public copies show (named per test); fields no copy
showed are marked "assumed" where they are used.
"""

from __future__ import annotations

import pytest

from kvstudy.errors import StudyError
from kvstudy.model import allocator as alloc
from kvstudy.model import capacity as cap
from kvstudy.model import layout as model_layout
from kvstudy.model.plan import plan_summary

GIB = 1024**3


def layout(config: dict, name: str = "cfg") -> cap.ModelLayout:
    return model_layout.layout_from_config(config, f"{name}/config.json")


def glm45_air() -> dict:
    """GLM-4.5-Air: 46 layers (1 dense + 45 MoE), 96 heads, 8 KV heads of 128 (the Megatron recipe
    'glm4.5-106B-A12B' found by code search); num_nextn_predict_layers 1 is assumed (the Hub config's MTP layer)."""
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "num_hidden_layers": 46,
        "hidden_size": 4096,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "vocab_size": 151552,
        "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }


def llama4_scout() -> dict:
    """Llama-4-Scout: the text_config of a public mirror's test (48 layers, 8 KV heads of 128, chunk 8192,
    no_rope_layers empty so every 4th layer is NoPE/global)."""
    return {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "num_hidden_layers": 48,
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attention_chunk_size": 8192,
            "no_rope_layers": [],
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            "vocab_size": 202048,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 262144,
        },
        "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34, "intermediate_size": 5632},
    }


def gemma3n_e4b() -> dict:
    """gemma-3n-E4B text config: 35 layers, (4 sliding + 1 full) x 7, window 512, 2 KV heads of 256, the last
    15 layers KV-shared (two public test copies)."""
    return {
        "model_type": "gemma3n",
        "architectures": ["Gemma3nForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma3n_text",
            "num_hidden_layers": 35,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "hidden_size": 2048,
            "head_dim": 256,
            "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
            "sliding_window": 512,
            "num_kv_shared_layers": 15,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 32768,
        },
    }


def granite_h_small() -> dict:
    """granite-4.0-h-small: 40 layers, 4 attention + 36 Mamba-2, 32 heads, 8 KV heads, hidden 4096,
    mamba_d_state 128, d_conv 4, expand 2 (a public worked example of the config). Assumed (no copy seen):
    mamba_n_heads 128 x mamba_d_head 64 (= expand x hidden), mamba_n_groups 1, and where the 4 attention layers sit."""
    types = ["mamba"] * 40
    for i in (5, 15, 25, 35):
        types[i] = "attention"
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 40,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "layer_types": types,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_n_heads": 128,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "num_local_experts": 72,
        "num_experts_per_tok": 10,
        "shared_intermediate_size": 1536,
        "intermediate_size": 768,
        "vocab_size": 100352,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }


def test_glm45_air_mtp_not_served_and_tp8() -> None:
    fp = cap.kv_footprint(layout(glm45_air()), "bfloat16", 4096)
    assert fp.bytes_per_token == 46 * 8 * (128 + 128) * 2 == 188_416
    assert cap.kv_footprint(layout(glm45_air()), "fp8", 4096).bytes_per_token == 94_208
    assert any("MTP" in note for note in layout(glm45_air()).notes)
    # TP 8: 8 KV heads / 8 GPUs = 1 head per GPU per layer
    tp8 = cap.kv_footprint(layout(glm45_air()), "bfloat16", 4096, tensor_parallel_size=8)
    assert tp8.bytes_per_token_per_gpu == 46 * 1 * 256 * 2 == 23_552
    assert tp8.bytes_per_token == 188_416  # the whole model's figure is unchanged


def test_tp_beyond_kv_heads_replicates_and_mla_keeps_its_latent() -> None:
    # TP 16 with 8 KV heads: each GPU still holds max(1, 8 // 16) = 1 head
    assert (
        cap.kv_footprint(layout(glm45_air()), "bfloat16", 16, tensor_parallel_size=16).bytes_per_token_per_gpu == 23_552
    )
    mla = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "hidden_size": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }
    assert cap.kv_footprint(layout(mla), "bfloat16", 16, tensor_parallel_size=8).bytes_per_token_per_gpu == 2 * 576 * 2


def test_llama4_scout_chunked_local_attention() -> None:
    lay = layout(llama4_scout())
    assert lay.layer_kinds == {cap.FULL: 12, cap.CHUNKED: 36}
    assert [l.index for l in lay.layers if l.kind == cap.FULL][:3] == [3, 7, 11]
    fp = cap.kv_footprint(lay, "bfloat16", 100_000)
    assert fp.bytes_per_token == 12 * 8 * 256 * 2 == 49_152
    assert cap.kv_footprint(lay, "fp8", 100_000).bytes_per_token == 24_576
    # a request of 100,000 tokens: global layers hold all, chunked layers at most 8192
    assert fp.bytes_per_request == 49_152 * 100_000 + 36 * 4096 * 8192
    assert fp.bytes_per_token_by_kind == {cap.CHUNKED: 36 * 4096, cap.FULL: 49_152}


def test_llama4_chunked_blocks_in_the_logged_pool() -> None:
    # CUDA: block 16, 4096 tokens in flight; chunked layers cdiv(min(8192 + 4096, 32768), 16) = 768 blocks,
    # global layers cdiv(32768, 16) = 2048. Two kinds: 12 full vs 36 chunked layers -> groups of 12:
    # 1 full group + 3 chunked groups; bytes per block = 12 layers x 16 tokens x 4096 B.
    pool = alloc.predict_logged_pool(layout(llama4_scout()), "bfloat16", 10 * GIB, 32768)
    assert pool.num_groups == 4
    assert pool.blocks_per_request == 2048 + 3 * 768
    assert pool.bytes_per_block == 12 * 16 * 4096


def test_gemma3n_shared_layers_store_nothing() -> None:
    lay = layout(gemma3n_e4b())
    assert lay.layer_kinds == {cap.FULL: 4, cap.SLIDING: 16, cap.SHARED: 15}
    fp = cap.kv_footprint(lay, "bfloat16", 4096)
    assert fp.bytes_per_token == 4 * 2 * (256 + 256) * 2 == 8_192
    assert cap.kv_footprint(lay, "fp8", 4096).bytes_per_token == 4_096
    assert fp.bytes_per_token_short == 20 * 2048
    pool = alloc.predict_logged_pool(lay, "bfloat16", GIB, 4096)
    assert pool.num_groups == 5  # 4 full in one group, 16 sliding in four groups of 4; shared layers: none


def test_granite_h_small_attention_and_mamba_state() -> None:
    lay = layout(granite_h_small())
    assert lay.layer_kinds == {cap.FULL: 4, cap.LINEAR: 36}
    fp = cap.kv_footprint(lay, "bfloat16", 4096)
    assert fp.bytes_per_token == 4 * 8 * 256 * 2 == 16_384
    assert cap.kv_footprint(lay, "fp8", 4096).bytes_per_token == 8_192
    # per Mamba-2 layer: conv (8192 + 2 x 1 x 128) x (4 - 1) + SSM 128 x 64 x 128 values, bf16
    per_layer = ((8192 + 256) * 3 + 128 * 64 * 128) * 2
    assert fp.state_bytes_per_request == 36 * per_layer == 77_322_240
    # the state stays in the model dtype with an fp8 KV cache
    assert cap.kv_footprint(lay, "fp8", 4096).state_bytes_per_request == 36 * per_layer
    # TP 4: conv channels and heads split; the single group is replicated to 4 (extra_groups_for_head_shards)
    tp4 = cap.kv_footprint(lay, "bfloat16", 4096, tensor_parallel_size=4)
    assert tp4.state_bytes_per_request_per_gpu == 36 * (((8192 + 2 * 4 * 128) // 4) * 3 + 32 * 64 * 128) * 2


def test_nemotron_h_pattern_and_float32_ssm_state() -> None:
    # Nemotron-H-8B: pattern of 52 layers, 24 M, 4 *, 24 - (a public worked example); the Mamba fields
    # (128 heads of 64, 8 groups, state 128, kernel 4) and the attention shape are assumed here.
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    cfg = {
        "model_type": "nemotron_h",
        "num_hidden_layers": 52,
        "hybrid_override_pattern": pattern,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "intermediate_size": 21504,
        "vocab_size": 131072,
        "torch_dtype": "bfloat16",
    }
    lay = layout(cfg)
    assert lay.layer_kinds == {cap.FULL: 4, cap.LINEAR: 24}
    fp = cap.kv_footprint(lay, "bfloat16", 1024)
    assert fp.bytes_per_token == 16_384
    conv = (8192 + 2 * 8 * 128) * 3 * 2  # bf16
    ssm = 128 * 64 * 128 * 4  # float32 (vLLM's default for Nemotron-H)
    assert fp.state_bytes_per_request == 24 * (conv + ssm)


def test_falcon_h1_has_attention_and_mamba_in_every_layer() -> None:
    cfg = {
        "model_type": "falcon_h1",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "mamba_d_ssm": 128,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 1,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    fp = cap.kv_footprint(layout(cfg), "bfloat16", 10)
    assert layout(cfg).layer_kinds == {cap.FULL: 2, cap.LINEAR: 2}
    assert fp.bytes_per_token == 2 * 2 * 32 * 2
    assert fp.state_bytes_per_request == 2 * ((128 + 2 * 8) * 3 + 8 * 16 * 8) * 2


def test_jamba_mamba1_state() -> None:
    cfg = {
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "mamba_expand": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    fp = cap.kv_footprint(layout(cfg), "bfloat16", 10)
    assert layout(cfg).layer_kinds == {cap.FULL: 1, cap.LINEAR: 7}
    assert fp.bytes_per_token == 1 * 1 * 32 * 2
    assert fp.state_bytes_per_request == 7 * (128 * 3 + 128 * 16) * 2


def test_all_windowed_model_is_never_zero() -> None:
    from pathlib import Path

    mistral = Path(__file__).resolve().parents[3] / "data" / "models" / "Mistral-7B-v0.1"
    fp = cap.kv_footprint(mistral, "bfloat16", 32768)
    assert fp.bytes_per_token == 32 * 8 * 256 * 2 == 131_072  # per token within the window
    assert fp.cap_tokens == 4096
    assert fp.bytes_per_request == 131_072 * 4096  # the request stops growing at the window
    assert fp.tokens_per_gib == GIB / 131_072


def test_qwen3_next_align_mode_reserves_two_state_blocks() -> None:
    from pathlib import Path

    nxt = Path(__file__).resolve().parents[3] / "data" / "models" / "Qwen3-Next-80B-A3B-Instruct"
    none = alloc.predict_logged_pool(nxt, "bfloat16", 10 * GIB, 4096, mamba_cache_mode="none")
    align = alloc.predict_logged_pool(nxt, "bfloat16", 10 * GIB, 4096, mamba_cache_mode="align")
    # 12 full + 36 linear layers: groups of 12, 1 full + 3 linear groups; align adds one block per linear group
    assert align.blocks_per_request == none.blocks_per_request + 3
    # vLLM 0.32 turns prefix caching on by default, and with it align mode for hybrid models
    assert alloc.predict_logged_pool(nxt, "bfloat16", 10 * GIB, 4096) == align
    with pytest.raises(StudyError, match="mamba_cache_mode"):
        alloc.predict_logged_pool(nxt, "bfloat16", GIB, 4096, mamba_cache_mode="all")
    assert any("mamba cache mode 'align'" in note for note in plan_summary(str(nxt), max_model_len=4096)["notes"])
    assert not any("mamba" in note for note in plan_summary(str(nxt.parent / "Qwen3-8B"))["notes"])


@pytest.mark.parametrize(
    "args, mode",
    [
        ([], "align"),
        (["--no-enable-prefix-caching"], "none"),
        (["--enable-prefix-caching"], "align"),
        (["--mamba-cache-mode", "none"], "align"),  # vLLM turns "none" into "align" while prefix caching is on
        (["--mamba-cache-mode=align", "--no-enable-prefix-caching"], "none"),  # and anything into "none" without it
        (["--mamba-cache-mode", "all"], "all"),
    ],
)
def test_the_mamba_cache_mode_follows_the_server_arguments(args: list[str], mode: str) -> None:
    assert alloc.mamba_cache_mode_for(args) == mode


def test_unknown_model_type_says_what_to_do_and_assume_warns() -> None:
    cfg = {
        "model_type": "brand_new",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    with pytest.raises(StudyError, match="--assume FAMILY"):
        layout(cfg)
    assumed = model_layout.layout_from_config(cfg, "x/config.json", assume="llama")
    assert assumed.warnings and "'llama'" in assumed.warnings[0]
    assert cap.kv_footprint(assumed, "bfloat16", 4).bytes_per_token == 2 * 2 * 32 * 2
    with pytest.raises(StudyError, match="assume 'nope'"):
        model_layout.layout_from_config(cfg, "x/config.json", assume="nope")


def test_users_count_a_hybrid_models_state_twice_as_align_mode_reserves_it() -> None:
    from pathlib import Path

    from kvstudy.model.plan import users_at

    nxt = cap.load_layout(Path(__file__).resolve().parents[3] / "data" / "models" / "Qwen3-Next-80B-A3B-Instruct")
    fp = cap.kv_footprint(nxt, "bfloat16", 8192)
    assert fp.state_bytes_per_request_per_gpu > 0
    pool = 40 * GIB
    assert users_at(nxt, "bfloat16", pool, 8192) == pool // (
        fp.bytes_per_request_per_gpu + fp.state_bytes_per_request_per_gpu
    )
    assert users_at(nxt, "bfloat16", pool, 8192) < pool // fp.bytes_per_request_per_gpu
    dense = cap.load_layout(Path(__file__).resolve().parents[3] / "data" / "models" / "Qwen3-8B")
    assert (
        users_at(dense, "bfloat16", pool, 8192)
        == pool // cap.kv_footprint(dense, "bfloat16", 8192).bytes_per_request_per_gpu
    )
