"""The tiny model: deterministic, Qwen3-shaped, rebuilt when half-built, never deletes foreign files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.tools.tiny_model import MARKER, ensure_tiny_model


def test_shape_and_tokenizer(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    ) == (4, 256, 4, 2, 64)
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


def test_folder_without_marker_is_never_deleted(tmp_path: Path) -> None:
    """Issue 10.1: standard Hugging Face names alone do not make a folder ours (builds go to a
    temporary folder and are swapped in, so an interrupted build never leaves one like this)."""
    folder = tmp_path / "real-model"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        (folder / name).write_text("precious")
    with pytest.raises(StudyError, match="no .* marker"):
        ensure_tiny_model(folder)
    assert sorted(p.read_text() for p in folder.iterdir()) == ["precious"] * 4


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


def test_sizes_are_named_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    """`--size speed` is the same recipe, larger (longer decode steps for the CPU speed sweep)."""
    from kvstudy import cli
    from kvstudy.tools.tiny_model import SIZES, TinyModelSpec

    assert SIZES["tiny"] == TinyModelSpec()
    speed = SIZES["speed"]
    assert speed.num_hidden_layers > 4 and speed.hidden_size > 256
    assert speed.hidden_size == speed.num_attention_heads * speed.head_dim
    assert speed.num_attention_heads % speed.num_key_value_heads == 0
    tiny = TinyModelSpec()
    assert (speed.seed, speed.vocab_size, speed.build_version) == (tiny.seed, tiny.vocab_size, tiny.build_version)
    assert sorted(SIZES) == ["speed", "tiny"]
    assert cli.main(["tiny-model", "build", "--size", "huge"]) == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_folder_of_another_size_is_rebuilt_to_the_asked_spec(tmp_path: Path) -> None:
    from kvstudy.tools.tiny_model import TinyModelSpec

    small = TinyModelSpec(
        num_hidden_layers=1,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=300,
        corpus_lines=400,
    )
    other = TinyModelSpec(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=300,
        corpus_lines=400,
    )
    folder = ensure_tiny_model(tmp_path / "m", small)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 1
    ensure_tiny_model(folder, other)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    assert json.loads((folder / MARKER).read_text())["spec"] == dataclasses.asdict(other)
