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
    assert "$PROFILE" in dry.stdout  # the recipe reads the variable from the environment
