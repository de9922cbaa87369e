"""What the users-axis experiments share on the grid engine: a report's parameters filled from its capture."""

from __future__ import annotations

from pathlib import Path

from kvstudy.io import REPO_ROOT
from kvstudy.speed import analysis as speed

CAPTURE = REPO_ROOT / "data" / "captures" / "speed-cpu"


def test_capture_settings_fill_what_the_report_left_none(tmp_path: Path) -> None:
    params = {"users": None, "seeds": [7], "configurations": None, "registered_runs_per_arm": None, "profile": "p"}
    shown, read = speed.capture_settings(params, CAPTURE)
    spec = speed.load_spec(CAPTURE)
    assert read == {"users", "configurations", "registered_runs_per_arm"}
    assert shown == {
        "users": spec.users,
        "seeds": [7],
        "configurations": [a.name for a in spec.configurations],
        "registered_runs_per_arm": len(spec.seeds),
        "profile": "p",
    }
    assert speed.capture_settings(params, tmp_path) == (params, set())  # no capture: nothing filled
