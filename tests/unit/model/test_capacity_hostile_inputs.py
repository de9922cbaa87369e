"""`kvstudy capacity` on hostile configs and values (issue 10): one line naming the field, exit 2,
bounded memory, and messages that say what was wrong."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.errors import StudyError
from kvstudy.model.capacity import kv_footprint

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "data" / "tiny-models" / "tiny-qwen3"


@pytest.fixture(autouse=True)
def _tiny_model_built(tiny_model: Path) -> None:
    """Every test here reads the tiny model's folder: build it (once per session) before each, so that no
    test depends on another test having built it first (the unit tests run on several workers)."""


def _model(tmp_path: Path, **changes: Any) -> Path:
    config = json.loads((TINY / "config.json").read_text())
    config.pop("layer_types", None)
    config.update(changes)
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _capacity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["capacity", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"num_hidden_layers": 10**9}, "'num_hidden_layers' is 1000000000 (expected at most 10,000)"),
        ({"num_hidden_layers": 2, "layer_types": [["x"], "full_attention"]}, "'layer_types[0]' is ['x']"),
        ({"num_hidden_layers": 2, "layer_types": [{"a": 1}, "full_attention"]}, "'layer_types[0]' is {'a': 1}"),
    ],
)
def test_hostile_configs_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], expected: str
) -> None:
    code, err = _capacity(capsys, str(_model(tmp_path, **changes)))
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_header_dtype_as_a_list_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path)
    header = json.dumps({"w": {"dtype": ["BF16"], "shape": [2], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    code, err = _capacity(capsys, str(folder), "--gpu", "L4")
    assert (
        code == 2 and "model.safetensors: not a readable safetensors file" in err and len(err.strip().splitlines()) == 1
    ), err


def test_unicode_digit_skip_layers_and_zero_length_say_what_was_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _capacity(capsys, str(TINY), "--skip-layers", "²")
    assert code == 2 and "skip layers '²'" in err, err
    code, err = _capacity(capsys, str(TINY), "--max-model-len", "0")
    assert code == 2 and "--max-model-len: expected an integer from 1 to 10,000,000" in err
    assert "max_position_embeddings" not in err


def test_context_len_as_text_is_named() -> None:
    with pytest.raises(StudyError, match="context length '4k': expected a positive integer") as info:
        kv_footprint(str(TINY), "auto", context_len="4k")  # type: ignore[arg-type]
    assert "max_position_embeddings" not in str(info.value)
