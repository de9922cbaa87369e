"""`kvstudy roofline`: JSON keys, the done-when figures, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstudy.cli import main

ROOT = Path(__file__).resolve().parents[3]
KVSTUDY = Path(sys.executable).parent / "kvstudy"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["roofline", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_qwen_l4(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "data/models/Qwen3-8B", "--gpu", "L4", "--context", "1100", "--users", "1")
    for key in (
        "steps",
        "predicted_tpot_ms",
        "fp8_speedup_pct",
        "assumptions",
        "kv_dominates_from_tokens",
        "predicted_itl_slope_ms_per_token",
    ):
        assert key in data
    assert set(data["steps"]) == {"bfloat16", "fp8"} == set(data["predicted_tpot_ms"])
    assert data["fp8_speedup_pct"] == pytest.approx(0.53, abs=0.02)
    assert {a["name"]: a["origin"] for a in data["assumptions"]}["bandwidth_factor"] == "assumed"


def test_llama_h100_32k(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "data/models/Llama-3.1-8B", "--gpu", "H100-SXM", "--context", "32768", "--users", "1")
    assert data["fp8_speedup_pct"] == pytest.approx(12.5, abs=0.1)


def test_options(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys,
        "data/models/Qwen3-8B",
        "--gpu",
        "l4",
        "--context",
        "4096",
        "--users",
        "4",
        "--kv-dtype",
        "auto",
        "fp8",
        "nvfp4",
        "--bandwidth-factor",
        "0.7",
        "--weights-gib",
        "15.26",
    )
    assert list(data["steps"]) == ["auto", "fp8", "nvfp4"]
    assert data["bandwidth_factor"] == 0.7 and data["weights"]["total_source"] == "given"
    assert data["baseline_dtype"] == "auto" and data["fp8_dtype"] == "fp8"


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roofline", "data/models/gemma-3-27b-it", "--gpu", "H200", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "predicted FP8 speedup" in out and "[assumed]" in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["--gpu", "V100", "--context", "1000"], "known: L4, A10G"),
        (["--gpu", "L4", "--context", "0"], "--context: expected an integer from 1 to 10,000,000, got '0'"),
        (["--gpu", "L4", "--context", "-3"], "--context: expected an integer from 1 to 10,000,000, got '-3'"),
        (["--gpu", "L4", "--context", "50000"], "max_position_embeddings 40,960"),
        (["--context", "1000"], "--gpu"),
        (["--gpu", "L4", "--context", "100", "--weights-gib", "0"], "weights bytes 0: expected a positive number"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], match: str) -> None:
    assert main(["roofline", "data/models/Qwen3-8B", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and match in err and err.count("\n") == 1


def test_console_command_exit_code() -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [str(KVSTUDY), "roofline", "data/models/Qwen3-8B", "--gpu", "nope", "--context", "10"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "MI300X" in out.stderr
