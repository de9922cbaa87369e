"""Every benchmark and maintenance script still imports what it uses from kvstudy: mypy checks src/
only, so a moved or renamed function would otherwise surface only when someone runs the script.
Each is loaded as a module (its ``__main__`` block does not run, so nothing is measured or written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")])
LOAD = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='imported_by_test')"


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_imports_what_it_uses(script: Path) -> None:
    assert '__name__ == "__main__"' in script.read_text(), f"{script.name}: no __main__ guard"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
