"""Make variables reach the shell as data: a PROFILE or ONLY with shell syntax runs nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("variable", ["PROFILE", "ONLY"])
def test_make_variables_are_not_pasted_into_the_shell(tmp_path: Path, variable: str) -> None:
    planted = tmp_path / "planted"
    # -n prints the recipe the shell would get; an unquoted variable would show the command itself
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "all", f"{variable}=x; touch {planted}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert f"touch {planted}" not in dry.stdout.replace(f'"$${variable}"', ""), dry.stdout
    plain = subprocess.run(["make", "-n", "-C", str(ROOT), "all"], capture_output=True, text=True, check=False)
    assert '"$PROFILE"' in plain.stdout  # the recipe reads the variable from the environment


HOSTILE = [
    "x; touch {marker}",
    "$(shell touch {marker})",
    "`touch {marker}`",
    "$$(touch {marker})",
    "a b; touch {marker}",
    "a\ntouch {marker}",
]


def _fake_venv(tmp_path: Path) -> Path:
    """A VENV whose stamp is current and whose ``kvstudy`` only records its arguments."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    kvstudy = venv / "bin" / "kvstudy"
    kvstudy.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "called"}\n')
    kvstudy.chmod(0o755)
    (venv / ".analysis-installed").touch()
    return venv


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("variable", ["PROFILE", "ONLY"])
@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_make_variables_execute_nothing(tmp_path: Path, variable: str, template: str) -> None:
    marker = tmp_path / "executed"
    venv = _fake_venv(tmp_path)
    value = template.format(marker=marker)
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "all", f"VENV={venv}", f"{variable}={value}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert not marker.exists(), done.stdout + done.stderr
    assert done.returncode != 0 and f"{variable}: expected" in done.stderr, done.stderr
    assert not (tmp_path / "called").exists()  # refused before any recipe ran


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_plain_make_variables_still_reach_the_command(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    done = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT),
            "all",
            f"VENV={venv}",
            "PROFILE=my.profile-2",
            "ONLY=01_a notebooks/02_b.ipynb",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    called = (tmp_path / "called").read_text().splitlines()
    assert called == ["render", "--profile", "my.profile-2", "--only", "01_a", "notebooks/02_b.ipynb"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "ONLY=01_capacity-math --profile other",
            "ONLY: expected notebook names only (set the profile with PROFILE=), found '--profile'",
        ),
        ("PROFILE=../x", "without folder or .yaml), found '/' in it"),
        ("PROFILE=..x", "PROFILE: expected a profile name (a file in profiles/ without .yaml), found one starting"),
        ("PROFILE=-x", "found one starting with '.' or '-'"),
    ],
)
def test_smuggled_options_and_paths_are_refused_naming_what(tmp_path: Path, setting: str, message: str) -> None:
    """Issue 30's second corpus: ONLY carried a second --profile into the render; PROFILE=../x was
    refused without saying what was wrong."""
    venv = _fake_venv(tmp_path)
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "all", f"VENV={venv}", setting],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert not (tmp_path / "called").exists()
