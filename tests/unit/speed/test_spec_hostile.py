"""Issue 10: secrets in a sweep spec stay out of its manifest form; hostile spec files are one line.

Each field's type and bound: tests/unit/bench/test_spec.py (every grid experiment's spec)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvstudy.cli import main as cli_main
from kvstudy.speed.spec import SweepSpec

BASE: dict[str, Any] = {
    "model": "m",
    "configurations": [{"name": "auto"}],
    "seeds": [0],
    "users": [1],
    "input_len": 8,
    "output_len": 4,
    "cpu_kvcache_space_gib": 1,
}


def test_env_reference_is_accepted_and_kept_in_the_manifest_form() -> None:
    spec = SweepSpec.from_dict({**BASE, "server_env": {"HF_TOKEN": {"from_env": "HF_TOKEN"}}})
    assert spec.to_dict()["server_env"] == {"HF_TOKEN": {"from_env": "HF_TOKEN"}}


def test_manifest_form_holds_no_secret() -> None:
    spec = SweepSpec.from_dict(
        {
            **BASE,
            "server_env": {"OPENAI_API_KEY": "sk-plantedplanted"},
            "configurations": [
                {
                    "name": "a",
                    "env": {"DATABASE_URL": "postgres://a:pw123@h/db"},
                    "extra_args": ["--api-key", "plantedvalue"],
                }
            ],
        }
    )
    text = json.dumps(spec.to_dict())
    assert "sk-plantedplanted" not in text and "pw123" not in text and "plantedvalue" not in text


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"\x00\xff\xfe\x01"), "not UTF-8"),
        (lambda p: (os.symlink(p.with_name("b"), p), os.symlink(p, p.with_name("b"))), "symlink loop"),
        (lambda p: p.write_text("[" * 10000), "nested deeper"),
    ],
)
def test_hostile_spec_files_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, words: str
) -> None:
    spec = tmp_path / "spec.json"
    make(spec)
    assert cli_main(["sweep", str(spec), str(tmp_path / "cap")]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
