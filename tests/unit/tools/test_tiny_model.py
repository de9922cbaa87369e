"""The tiny model: deterministic, Qwen3-shaped, rebuilt when half-built, never deletes foreign files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.tools.tiny_model import MARKER, ensure_tiny_model


def test_shape_and_tokenizer(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (4, 256, 4, 2, 64)
    assert config["max_position_embeddings"] >= 4096 and config["dtype"] == "bfloat16"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert 256 < len(tok) <= 1024 and tok.eos_token and tok.bos_token
    assert config["eos_token_id"] == tok.eos_token_id
    text = "Question: Tom has 12 apples and buys 30 more. Answer: 12 + 30 = <<12+30=42>>42\n#### 42"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text) / 2  # merges were learned


def test_rebuild_is_byte_identical(tiny_model: Path, tmp_path: Path) -> None:
    again = ensure_tiny_model(tmp_path / "copy")
    first = json.loads((tiny_model / MARKER).read_text())["files"]
    second = json.loads((again / MARKER).read_text())["files"]
    assert first == second and "model.safetensors" in first


def test_half_built_folder_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text("{")  # as an interrupted build might leave it
    ensure_tiny_model(folder)
    assert (folder / MARKER).is_file() and json.loads((folder / "config.json").read_text())["model_type"] == "qwen3"


def test_complete_folder_is_not_rebuilt(tiny_model: Path) -> None:
    before = (tiny_model / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tiny_model) == tiny_model
    assert (tiny_model / "model.safetensors").stat().st_mtime_ns == before


def test_foreign_files_are_never_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    with pytest.raises(StudyError, match="holds files a tiny-model build does not write"):
        ensure_tiny_model(folder)
    assert (folder / "thesis.tex").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if ".building" in p.name]  # no temporary build left
