"""`kvstudy design load`: seed blocks a change in users within the target needs, from a noise SD."""

from __future__ import annotations

import pytest

from kvstudy.cli import main
from kvstudy.report.design import runs_design


def test_more_noise_needs_more_blocks() -> None:
    quiet = runs_design("load", [50.0], sd=0.05)[0]
    loud = runs_design("load", [50.0], sd=0.5)[0]
    assert quiet.noise_origin == "given"
    assert quiet.runs_per_arm is not None and loud.runs_per_arm is not None
    assert quiet.runs_per_arm >= 6  # never fewer than the blocked test needs to reach p < 0.05
    assert loud.runs_per_arm > quiet.runs_per_arm


def test_cli_prints_one_line_per_change(capsys) -> None:
    assert main(["design", "load", "--noise-sd", "0.1", "--change", "50", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("noise SD of log users per seed block 0.100 (given)")
    assert len(out) == 3 and "seed blocks per arm" in out[1]


def test_a_capture_without_a_manifest_is_one_line(tmp_path, capsys) -> None:
    assert main(["design", "load", "--capture", str(tmp_path)]) == 2
    assert "manifest.json: missing" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["-1", "nan"])
def test_bad_noise_is_refused(bad, capsys) -> None:
    assert main(["design", "load", "--noise-sd", bad]) == 2
