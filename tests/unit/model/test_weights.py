"""Weights from the checkpoint (index, headers) or estimated from the config with its quantization."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.model import weights as w

GIB = 2**30


def gpt_oss_120b() -> dict:
    """gpt-oss-120b: 36 layers, 128 experts of 2880, hidden 2880, 64 heads and 8 KV heads of 64, vocab 201088
    (public config classes found by code search); MXFP4 experts, attention/router/embeddings/head kept 16-bit
    (the Hub config's modules_to_not_convert, transcribed)."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "num_hidden_layers": 36,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
    }


def write(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_gpt_oss_120b_mxfp4_is_about_61_gib(tmp_path: Path) -> None:
    size = w.weights_size(write(tmp_path / "gpt-oss-120b", gpt_oss_120b()))
    experts = 36 * 3 * 2880 * 2880 * 128  # 4.25 bits each (MXFP4: 4 bits + 1 byte / 32)
    attention = 36 * (2 * 2880 * 64 * 64 + 2 * 2880 * 8 * 64)  # 16-bit
    router = 36 * 2880 * 128  # 16-bit
    embeddings = 2 * 201088 * 2880  # 16-bit, untied
    expected = experts * 17 // 32 + 2 * (attention + router + embeddings)
    assert size.bytes == expected
    assert 60 < size.bytes / GIB < 62  # the "about 61 GiB" (not 217.5 at 16 bits)
    assert "MXFP4" in size.source and "attention" in size.source
    assert w.expert_routing(gpt_oss_120b()) == (128, 4)


def test_towers_are_counted(tmp_path: Path) -> None:
    text_only = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
    }
    with_tower = {**text_only, "vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64}}
    a = w.weights_size(write(tmp_path / "a", text_only))
    b = w.weights_size(write(tmp_path / "b", with_tower))
    assert b.bytes - a.bytes == 2 * 2 * (4 * 32 * 32 + 2 * 32 * 64)


@pytest.mark.parametrize(
    ("quant", "per_weight"),
    [
        ({"quant_method": "fp8"}, 1.0),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5 + 2 / 128 + 0.5 / 128),
        ({"quant_method": "gptq", "bits": 8, "group_size": 64}, 1 + 2 / 64 + 1 / 64),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
        ({"quant_method": "modelopt_fp4"}, 0.5 + 1 / 16),
    ],
)
def test_quantized_linear_layers(tmp_path: Path, quant: dict, per_weight: float) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    linear = 2 * (4 * 256 * 256 + 3 * 256 * 512)  # q, k, v, o (no GQA) + gate, up, down
    size = w.weights_size(write(tmp_path / "m", {**cfg, "quantization_config": quant}))
    assert size.bytes == pytest.approx(linear * per_weight + 1000 * 256 * 2, abs=2)


def test_unknown_quantization_names_the_way_out(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "quantization_config": {"quant_method": "mystery"},
    }
    with pytest.raises(StudyError, match="--weights-gib"):
        w.estimate_weights(cfg, "m/config.json")


def test_safetensors_headers_when_there_is_no_index(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "m",
        {
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        },
    )
    header = {
        "a": {"dtype": "BF16", "shape": [10, 64], "data_offsets": [0, 1280]},
        "b": {"dtype": "F8_E4M3", "shape": [64], "data_offsets": [1280, 1344]},
        "__metadata__": {"format": "pt"},
    }
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(1344))
    size = w.weights_size(folder)
    assert size.bytes == 10 * 64 * 2 + 64 and size.source.startswith("safetensors headers")
    (folder / "model.safetensors").write_bytes(b"\x01")
    with pytest.raises(StudyError, match="model.safetensors: not a readable safetensors file"):
        w.weights_size(folder)


def test_expert_routing_reads_each_spelling() -> None:
    assert w.expert_routing({"num_local_experts": 32, "experts_per_token": 4}) == (32, 4)  # gpt-oss
    assert w.expert_routing({"n_routed_experts": 256, "num_experts_per_tok": 8}) == (256, 8)  # DeepSeek
    assert w.expert_routing({"text_config": {"num_local_experts": 128, "num_experts_per_tok": 1}}) == (128, 1)
    assert w.expert_routing({"num_experts": 0, "moe_topk": True}) == (None, None)
    assert w.expert_routing({"hidden_size": 8}) == (None, None)


@pytest.mark.parametrize("act", [[], ["silu"], {"name": "silu"}, 3])
def test_an_activation_that_is_not_a_name_leaves_the_weights_unknown(act: object) -> None:
    # found by the property tests: a list here was a TypeError (unhashable) in the set lookup
    config = json.loads((Path(__file__).parents[3] / "data" / "models" / "Qwen3-8B" / "config.json").read_text())
    with pytest.raises(w.WeightsUnknown, match="'hidden_act' must be an activation name") as err:
        w.estimate_weights({**config, "hidden_act": act}, "config.json")
    assert "\n" not in str(err.value)
