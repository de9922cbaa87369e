"""Issue 25: an output path with a name longer than the filesystem allows (NAME_MAX, 255 bytes), or
under a file, is refused in one line before any work starts, by every command that takes one.

Before, capacity --csv, gsm8k-data, retrieval-data and checkpoints build gave an OSError traceback
(ENAMETOOLONG, ENOTDIR, EEXIST); the others were not checked before they started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.cli import main

COMMANDS = {
    "capacity --csv": lambda out: ["capacity", "data/models/Qwen3-8B", "--csv", out],
    "gsm8k-data": lambda out: ["gsm8k-data", out, "--n-test", "5", "--n-train", "5"],
    "retrieval-data": lambda out: ["retrieval-data", out, "--lengths", "64"],
    "checkpoints build": lambda out: ["checkpoints", "build", out, "plain-bf16"],
    "tiny-model build": lambda out: ["tiny-model", "build", out],
    "control-checkpoint": lambda out: ["control-checkpoint", "data/trained-model/qwen3-mini", out],
    "sweep": lambda out: ["sweep", "spec.json", out, "--dry-run"],
    "context-sweep": lambda out: ["context-sweep", "spec.json", out, "--dry-run"],
    "kv-simulate": lambda out: ["kv-simulate", out],
    "kv-screen": lambda out: ["kv-screen", "--baseline", "http://127.0.0.1:1", "--candidate", "x", "--capture", out],
    "gsm8k": lambda out: ["gsm8k", "--model", "m", "--capture", out],
    "train-model": lambda out: ["train-model", "--out", out],
}
BAD = {
    "name too long": (lambda tmp: str(tmp / ("n" * 300)), "a name of 300 bytes"),
    "name too long deeper": (lambda tmp: str(tmp / ("é" * 128) / "x"), "a name of 256 bytes"),
    "parent is a file": (lambda tmp: str(tmp / "afile" / "sub"), "afile is a file, not a folder"),
}


@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_output_path_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, bad: str
) -> None:
    (tmp_path / "afile").write_text("kept")
    make, words = BAD[bad]
    assert main(COMMANDS[command](make(tmp_path))) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1 and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and (tmp_path / "afile").read_text() == "kept"


@pytest.mark.parametrize("command", ["gsm8k-data", "retrieval-data", "checkpoints build", "sweep"])
def test_an_output_folder_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    (tmp_path / "afile").write_text("kept")
    assert main(COMMANDS[command](str(tmp_path / "afile"))) == 2
    err = capsys.readouterr().err
    assert "afile is a file, expected a folder" in err and err.count("\n") == 1
    assert (tmp_path / "afile").read_text() == "kept"
