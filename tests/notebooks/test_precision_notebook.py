"""Notebook 07 on the reference profile: the graded control through vLLM, the margin it calibrates and
the engine screen's equivalence verdict against it, as the package computes them from the bundles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from kvstudy.precision import analysis as an
from kvstudy.precision import records as rc
from kvstudy.profiles import declared_parameters, given_parameters, load_profile
from kvstudy.report import calibration as calib
from kvstudy.report.notebook import VERDICT_KEY

if TYPE_CHECKING:
    from conftest import Rendered  # tests/notebooks/conftest.py: the one render of the reference profile

ROOT = Path(__file__).resolve().parents[2]
STEM = "07_kv-precision"


def _verdicts(path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for cell in json.loads(path.read_text())["cells"]:
        for item in cell.get("outputs", []):
            record = item.get("metadata", {}).get(VERDICT_KEY)
            if record:
                out[record["topic"]] = record
    return out


@pytest.mark.notebooks
def test_the_ladder_calibrates_the_margin_of_the_engine_screen(reference: Rendered) -> None:
    params = given_parameters(
        load_profile("reference", ROOT / "profiles"), STEM, declared_parameters(ROOT / "notebooks" / f"{STEM}.ipynb")
    )
    assert params["ladder_dir"] == "data/captures/kv-calibrate-cpu"
    run = reference.runs[STEM]
    assert run.error is None, run.error
    ladder = calib.read_ladder(ROOT / params["ladder_dir"])
    screen = _verdicts(reference.executed(STEM))["engine screen"]["facts"]
    assert screen["margin_state"] == ladder.margin.state
    assert screen["margin_source"] == calib.margin_source(ladder).replace(f"{ROOT}/", "")
    expected = an.screen_facts(
        rc.load(ROOT / params["screen_capture_dir"]), ladder.margin.margin_kl, ladder.margin.state
    )
    assert screen["equivalence"] == expected["equivalence"]
    assert screen["margin_kl"] == (pytest.approx(ladder.margin.margin_kl) if ladder.margin.margin_kl else None)
    # the ladder's table: one row per grade, KL as the package reads it
    table = next(
        pd.read_csv(p) for p in sorted(reference.figures.glob("07-*.csv")) if "KV scales" in pd.read_csv(p, nrows=0)
    )
    kl = {g.factor: g.kl * 1000 for rows in ladder.grades.values() for g in rows}
    no_scales = table[table["KV scales"] == "none (1.0)"]
    assert list(no_scales["factor"]) == sorted(kl)
    assert list(no_scales["KL (mnats/token)"]) == pytest.approx([kl[f] for f in sorted(kl)])
