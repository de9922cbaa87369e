"""A Qwen3 model folder holding only a ``config.json``: all the context sweep's grid, manifest and
analysis read (``max_position_embeddings``, layer types, KV heads and head size). No weights, no
tokenizer, no torch, so these tests run on a clean checkout where the tiny model is not built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# The tiny model's config.json, as `kvstudy tiny-model build` writes it (src/kvstudy/tools/tiny_model.py,
# data/tiny-models/tiny-qwen3/config.json): 4 full-attention layers, 2 KV heads of size 64, 8,192 positions.
TINY_QWEN3_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "eos_token_id": 0,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"],
    "max_position_embeddings": 8192,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": None,
    "tie_word_embeddings": True,
    "transformers_version": "5.19.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 1024,
}


def _write_config_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY_QWEN3_CONFIG, indent=2) + "\n")
    return folder


@pytest.fixture(scope="session")
def qwen3_config_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder with the tiny Qwen3's config.json only, shared by the session: do not change it."""
    return _write_config_model(tmp_path_factory.mktemp("qwen3-config") / "model")


@pytest.fixture
def own_qwen3_config_model(tmp_path: Path) -> Path:
    """The same config-only model folder, a test's own (``tmp_path / "model"``), so the test may change it."""
    return _write_config_model(tmp_path / "model")
