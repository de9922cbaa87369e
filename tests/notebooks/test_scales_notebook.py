"""The scale-inspection notebook renders on the reference profile and records what the package computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from kvstudy.model import scale_verdicts, scales
from kvstudy.profiles import declared_parameters, given_parameters, load_profile

if TYPE_CHECKING:
    from conftest import Rendered  # tests/notebooks/conftest.py: the one render of the reference profile

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_scale-inspection.ipynb"


def _outputs_text(path: Path) -> str:
    nb = json.loads(path.read_text())
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            parts.append("".join(data.get("text/markdown", "") or data.get("text/plain", "") or out.get("text", "")))
    return "\n".join(parts)


@pytest.mark.notebooks
def test_notebook_finding_matches_the_package(reference: Rendered) -> None:
    profile = load_profile("reference", ROOT / "profiles")
    params = given_parameters(
        profile, NOTEBOOK.stem, declared_parameters(ROOT / "notebooks" / f"{NOTEBOOK.stem}.ipynb")
    )
    run = reference.runs[NOTEBOOK.stem]
    assert run.error is None, run.error
    assert (reference.figures / "04_scale_values.png").is_file()

    defaults = {"models": None, "logs": {}, "dump_root": None, "dump_logs": {}}
    nb_defaults = {}
    source = "".join(
        next(
            c
            for c in json.loads(NOTEBOOK.read_text())["cells"]
            if "parameters" in c.get("metadata", {}).get("tags", [])
        )["source"]
    )
    exec(source, {}, nb_defaults)  # the literals of the parameters cell
    values = {k: params.get(k, nb_defaults.get(k, v)) for k, v in defaults.items()}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        reports = [scales.inspect_model(m, log=values["logs"].get(m)) for m in values["models"]]
        dump = pd.DataFrame(scales.dump_kv_settings(values["dump_root"], values["dump_logs"]))
    expected = scale_verdicts.summarize(reports, dump)
    assert reference.finding(NOTEBOOK.stem) == expected["finding"]
    text = _outputs_text(reference.executed(NOTEBOOK.stem))
    for r in reports:
        assert r.source in text
        for verdict in r.verdicts:
            assert verdict in text
