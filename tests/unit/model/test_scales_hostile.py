"""Issue 10: `kvstudy scales` on hostile folders: containment, FIFOs, bad headers, exit codes."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.cli import main as cli_main
from kvstudy.model.scale_verdicts import ScaleReport
from kvstudy.model.scales import inspect_model, read_header


def shard(path: Path, header: dict, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def folder(tmp_path: Path, name: str = "m") -> Path:
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "num_key_value_heads": 1}))
    return out


def k_scale(value: float = 0.5) -> tuple[dict, bytes]:
    return (
        {"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}},
        struct.pack("<f", value),
    )


@pytest.mark.parametrize(
    "target",
    ["../outside/model.safetensors", "/etc/passwd", "/proc/self/environ", "sub/../../outside/model.safetensors"],
)
def test_index_cannot_point_outside_the_folder(tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = folder(tmp_path)
    (tmp_path / "outside").mkdir()
    shard(tmp_path / "outside" / "model.safetensors", *k_scale(0.25))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.layers.0.self_attn.k_scale": target}})
    )
    report = inspect_model(model)
    assert report.scales == [] and "outside the model folder" in " ".join(report.errors)
    assert cli_main(["scales", str(model)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_symlinked_shard_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    model = folder(tmp_path)
    shard(tmp_path / "elsewhere.safetensors", *k_scale(0.25))
    os.symlink(tmp_path / "elsewhere.safetensors", model / "model-1.safetensors")
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.layers.0.self_attn.k_scale": "model-1.safetensors"}})
    )
    assert inspect_model(model).scales == []


def test_fifo_shard_does_not_block(tmp_path: Path) -> None:
    model = folder(tmp_path)
    os.mkfifo(model / "model.safetensors")
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(cli_main(["scales", str(model)])), daemon=True)
    worker.start()
    worker.join(timeout=60)  # generous: only catches a hang
    assert result == [2]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x01\x02",
        struct.pack("<Q", 2**62) + b"{}",
        struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc",
        struct.pack("<Q", 100) + b"{}",
        struct.pack("<Q", 20000) + b"[" * 20000,
    ],
)
def test_unreadable_shards_exit_non_zero(tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    model = folder(tmp_path)
    (model / "model.safetensors").write_bytes(content)
    assert cli_main(["scales", str(model), "--json"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_good_shard_still_exits_zero(tmp_path: Path) -> None:
    model = folder(tmp_path)
    shard(model / "model.safetensors", *k_scale())
    assert cli_main(["scales", str(model), "--json"]) == 0


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": ["F32"], "shape": [], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
    ],
)
def test_odd_header_entries_are_errors_not_tracebacks(tmp_path: Path, entry: dict) -> None:
    model = folder(tmp_path)
    shard(model / "model.safetensors", {"model.layers.0.self_attn.k_scale": entry}, b"\0" * 4)
    report = inspect_model(model)
    assert report.scales == [] and report.errors


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_any_shard_bytes_give_a_header_or_an_error(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    path.write_bytes(data)
    sink = ScaleReport(str(path), None)
    header = read_header(path, sink)
    assert (header is None) == bool(sink.errors)
