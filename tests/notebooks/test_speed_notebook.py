"""The speed notebook on the reference profile: it renders and states what the bundled data says."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy import render as report
from kvstudy.speed import analysis as speed

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_speed-sweep.ipynb"


@pytest.mark.notebooks
def test_reference_render_recomputes_published_ratio_and_reads_capture(tmp_path: Path) -> None:
    profile = report.load_profile("reference", ROOT / "profiles")
    params = report.notebook_parameters(profile, NOTEBOOK.stem, "reference", tmp_path / "figures")
    assert params["run_missing"] is False  # the reference profile never starts vLLM
    run = report.run_notebook(NOTEBOOK, tmp_path / "reports", params, ROOT)
    assert run.error is None, run.error
    assert "L4 published, 1 user(s): fp8 +2.3 % per token, at clocks equal within tolerance" in run.finding
    assert "32 user(s): fp8 +3.4 % per token, no claim: the median clocks differ by +6.7 %" in run.finding
    cap = speed.load_capture(ROOT / params["capture"])
    html = run.html_path.read_text()
    for cell in cap.spec.cells():  # every cell of the bundled capture is listed with its state
        assert cell.id in html
    # the bundled capture has per-request records and telemetry, and the views were drawn from them
    assert len(cap.requests) and len(cap.telemetry)
    for name in ("speed-distributions", "speed-clock", "speed-seed-ranges"):
        assert (tmp_path / "figures" / f"{name}.png").is_file(), name
