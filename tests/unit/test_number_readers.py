"""Issue 25: every number reader refuses non-finite, huge and out-of-bound values in one line (exit 2,
no traceback), and every command's count or size argument names its bound.

Each case gave a traceback (OverflowError, ZeroDivisionError, ValueError, numpy TypeError) or ran
without end (``gsm8k-data --n-test 10**20``) before.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvstudy.cli import main

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "data" / "models" / "Qwen3-8B" / "config.json"
BENCH = ROOT / "data" / "captures" / "speed-cpu" / "bench"
HUGE = "9" * 400  # parses as a JSON integer; float() of it overflows
HUGER = "9" * 5000  # past Python's 4,300-digit int conversion limit


def one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], words: str = "") -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    return err


def config_with(tmp_path: Path, key: str, literal: str) -> Path:
    text = re.sub(rf'("{key}":\s*)-?[0-9.eE+]+', lambda m: m.group(1) + literal, QWEN.read_text(), count=1)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


# Which command reads which field (issue 30: a config is validated where the figure reads it, so a
# bad number in a field the command does not use is accepted as it is): head_dim gives the KV bytes,
# max_position_embeddings the request length of capacity, hidden_size the roofline's parameter count.
READS = {
    "head_dim": {"capacity", "capacity-gpu", "roofline"},
    "hidden_size": {"roofline"},
    "max_position_embeddings": {"capacity", "capacity-gpu"},  # roofline is given --context
}


@pytest.mark.parametrize("key", ["head_dim", "hidden_size", "max_position_embeddings"])
@pytest.mark.parametrize("literal", [HUGE, "1e999", "NaN", "-Infinity"])
@pytest.mark.parametrize("command", ["capacity", "capacity-gpu", "roofline"])
def test_config_numbers_are_refused_in_one_line_where_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, literal: str, command: str
) -> None:
    folder = str(config_with(tmp_path, key, literal))
    argv = {
        "capacity": ["capacity", folder, "--json"],
        "capacity-gpu": ["capacity", folder, "--gpu", "L4", "--json"],
        "roofline": ["roofline", folder, "--gpu", "L4", "--context", "100"],
    }[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 1
    if command in READS[key]:
        assert code == 2 and err.startswith("kvstudy: error: ") and key in err, err
    else:  # a field this figure does not read: accepted as it is
        assert code == 0 and err == "", err


@pytest.mark.parametrize("key", ["head_dim", "hidden_size"])
def test_config_huge_integer_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    folder = str(config_with(tmp_path, key, HUGE))
    one_line_exit_2(["roofline", folder, "--gpu", "L4", "--context", "100"], capsys, f"field '{key}' is 999")


def test_scales_accepts_a_huge_number_it_does_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(config_with(tmp_path, "head_dim", HUGE))  # scales reads tensors and KV settings, not head_dim
    assert main(["scales", folder]) == 0
    assert "Traceback" not in capsys.readouterr().err


def bench_folders(tmp_path: Path, key: str, literal: str) -> tuple[str, str]:
    base, cand = tmp_path / "base", tmp_path / "cand"
    base.mkdir()
    cand.mkdir()
    files = sorted(BENCH.glob("auto__s*__u1.json"))[:3]
    for f in files[1:]:
        shutil.copy(f, base)
    for f in sorted(BENCH.glob("fp8__s*__u1.json"))[:3]:
        shutil.copy(f, cand)
    text = files[0].read_text()
    pattern = rf'("{key}":\s*\[?\s*)-?[0-9.eE+]+'
    (base / files[0].name).write_text(re.sub(pattern, lambda m: m.group(1) + literal, text, count=1))
    return str(base), str(cand)


@pytest.mark.parametrize(
    "key, literal, words",
    [
        ("num_prompts", HUGER, "malformed JSON"),
        ("num_prompts", HUGE, "num_prompts is beyond"),
        ("latencies", "1e308", "latencies[0] is beyond"),
        ("ttfts", "1e999", "ttfts[0] is inf"),
        ("duration", "NaN", "duration is nan"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_bench_result_numbers_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, literal: str, words: str, as_json: bool
) -> None:
    base, cand = bench_folders(tmp_path, key, literal)
    one_line_exit_2(["speed", "compare", base, cand, *(["--json"] if as_json else [])], capsys, words)


@pytest.mark.parametrize("option", ["--n", "--baseline", "--candidate"])
@pytest.mark.parametrize("value", [HUGE, "1e999", "nan", "10000001"])
def test_totals_counts_are_bounded(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    args = {"--n": "100", "--baseline": "10", "--candidate": "9", option: value}
    one_line_exit_2(["accuracy", "totals", *[x for kv in args.items() for x in kv]], capsys, option)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["roofline", "data/models/Qwen3-8B", "--gpu", "L4", "--context", "100", "--weights-gib", "inf"], "0 to"),
        (["roofline", "data/models/Qwen3-8B", "--gpu", "L4", "--context", "100", "--users", "0"], "1 to 100,000"),
        (["roofline", "data/models/Qwen3-8B", "--gpu", "L4", "--context", HUGER], "1 to 10,000,000"),
        (["capacity", "data/models/Qwen3-8B", "--tensor-parallel-size", "0"], "1 to 4,096"),
        (["capacity", "data/models/Qwen3-8B", "--gpu-memory-gib", "1e999"], "0 to 1.04858e+06"),
        (["gsm8k-data", "OUT", "--n-test", "100000000000000000000"], "1 to 1,000,000"),
        (["gsm8k-data", "OUT", "--n-train", "-1"], "1 to 1,000,000"),
        (["retrieval-data", "OUT", "--n-needles", "100000000000000000000"], "1 to 10,000"),
        (["retrieval-data", "OUT", "--chars-per-token", "nan"], "0.01 to"),
        (["kv-simulate", "OUT", "--gsm8k-n", "-1"], "0 to 1,000,000"),
        (["kv-simulate", "OUT", "--threads", "0"], "1 to 4,096"),
        (["gsm8k", "--model", "m", "--capture", "OUT", "--n", "0"], "1 to 1,000,000"),
        (["context-sweep", "s.json", "OUT", "--max-servers", "-1"], "0 to 100,000"),
        (["speed", "compare", "a", "b", "--clock-tolerance-pct", "inf"], "0 to 100"),
        (["train-model", "--out", "OUT", "--steps-scale", "1e999"], "1e-06 to"),
    ],
)
def test_command_numbers_are_refused_naming_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    one_line_exit_2(argv, capsys, words)
    assert not (tmp_path / "out").exists()
