"""The context sweep's grid: validation (bad input: one line), order, resume bookkeeping. No vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench.grid import cells_to_run
from kvstudy.cli import main
from kvstudy.context.spec import ContextSweepSpec, default_arms
from kvstudy.errors import StudyError


@pytest.fixture
def base(qwen3_config_model: Path) -> dict[str, Any]:
    """A valid grid on a config-only Qwen3 folder (the tiny model's config: 8,192 positions)."""
    return {
        "model": str(qwen3_config_model),
        "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
        "lengths": [256, 1024],
        "seeds": [0, 1],
        "output_len": 16,
        "cpu_kvcache_space_gib": 1,
    }


def test_interleaved_order_and_alternating_lengths(base: dict[str, Any]) -> None:
    spec = ContextSweepSpec.from_dict(base)
    assert [r.id for r in spec.runs()] == ["auto__s0", "fp8__s0", "auto__s1", "fp8__s1"]
    assert [c.id for c in spec.cells()[:4]] == [
        "auto__s0__L256",
        "auto__s0__L1024",
        "fp8__s0__L1024",
        "fp8__s0__L256",
    ]
    assert spec.served_max_model_len == 1024 + 16 + 64


@pytest.mark.parametrize(
    "change, words",
    [
        ({"lengths": [256, 9000]}, "max_position_embeddings 8192"),
        ({"lengths": [0, 256]}, "lengths[0]: expected greater than or equal to 1"),
        ({"lengths": [256]}, "lengths: expected at least 2 items"),
        ({"lengths": [256, 256]}, "expected no value twice"),
        ({"arms": []}, "arms: expected at least 1 item"),
        ({"arms": [{"name": "x", "kv_cache_dtype": "fp9"}]}, "unknown kv_cache_dtype"),
        ({"cpu_kvcache_space_gib": None}, "no fixed KV pool"),
        ({"max_model_len": 512}, "max_model_len 512"),
        ({"colour": 1}, "unknown field"),
    ],
)
def test_bad_specs_raise_one_line(base: dict[str, Any], change: dict, words: str) -> None:
    with pytest.raises(StudyError) as err:
        ContextSweepSpec.from_dict({**base, **change})
    assert words in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_spec_exits_nonzero_with_one_line(
    base: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**base, "lengths": [256, 9000]}))
    assert main(["context-sweep", str(path), str(tmp_path / "cap"), "--dry-run"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "max_position_embeddings" in err


def test_resume_keeps_ok_and_failed_cells_unless_retry_failed(base: dict[str, Any], tmp_path: Path) -> None:
    """The one done rule of every experiment (kvstudy.capture.needs_run): a failed cell, whatever
    failed, runs again only with retry_failed."""
    spec = ContextSweepSpec.from_dict(base)
    cells = tmp_path / "cells"
    cells.mkdir()
    (cells / "auto__s0__L256.json").write_text(json.dumps({"status": "ok"}))
    (cells / "fp8__s0__L256.json").write_text(json.dumps({"status": "failed", "start_failed": True}))
    (cells / "auto__s1__L256.json").write_text(json.dumps({"status": "failed"}))
    todo = [c.id for c in cells_to_run(tmp_path, spec.cells())]
    assert "auto__s0__L256" not in todo and "fp8__s0__L256" not in todo
    assert "auto__s1__L256" not in todo and "fp8__s1__L256" in todo  # missing: runs
    retry = [c.id for c in cells_to_run(tmp_path, spec.cells(), retry_failed=True)]
    assert "fp8__s0__L256" in retry and "auto__s1__L256" in retry and "auto__s0__L256" not in retry


def test_default_arms_for_full_attention_model(qwen3_config_model: Path) -> None:
    assert [a.name for a in default_arms(str(qwen3_config_model))] == ["auto", "fp8"]
