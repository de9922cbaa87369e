"""A render killed part way (kill -9) heals on the next one (issue 25): staging folders it left are
removed, and the index and status.json are rebuilt from the reports on disk, even for notebooks the
next render does not run (``ONLY=...``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.unit.test_render import OK_BODY, make_notebook

from kvstudy.report import render as report
from kvstudy.report.html import INTERRUPTED, status_from_reports

OTHER_BODY = "from kvstudy.report.notebook import finding\nfinding(f'other notebook saw {value}')"


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    make_notebook(tmp_path / "notebooks" / "01_ok.ipynb", OK_BODY)
    make_notebook(tmp_path / "notebooks" / "03_other.ipynb", OTHER_BODY)
    (tmp_path / "profiles" / "demo.yaml").write_text(
        "description: a demo\ndefaults: {value: 5}\nnotebooks:\n  01_ok: {value: 21}\n  03_other:\n"
    )
    return tmp_path


def test_a_killed_render_heals_on_the_next_one(study: Path) -> None:
    report.run_profile("demo", root=study)
    reports = study / "reports"
    out = reports / "demo"
    # what a kill -9 leaves: staging folders with half-made files, and a status.json / index.html
    # written before the last notebook's reports were moved in (03_other's is missing, 01_ok's stale)
    left = reports / ".staging" / "demo" / "tmpk1ll3d0"
    left.mkdir(parents=True)
    (left / "01_ok.html").write_text("half")
    other_profile = reports / ".demo-x-ab12cd34"  # another profile's: never touched
    other_profile.mkdir()
    status = json.loads((out / "status.json").read_text())
    del status["03_other"]
    status["01_ok"]["finding"] = "a stale finding"
    (out / "status.json").write_text(json.dumps(status))
    (out / "index.html").write_text("<p>a stale finding</p><li>03_other &mdash; not rendered yet</li>")
    # the last render of 03_other failed after its good report: the failed one is newer
    (out / "03_other.failed.html").write_text("<p>stopped</p>")
    older = (out / "03_other.html").stat().st_mtime - 60
    os.utime(out / "03_other.html", (older, older))

    report.run_profile("demo", root=study, only=["01_ok"])

    assert not left.exists() and other_profile.is_dir()
    assert list((reports / ".staging" / "demo").iterdir()) == []
    healed = json.loads((out / "status.json").read_text())
    assert healed["01_ok"]["finding"] == "value is 42 on demo"
    assert healed["03_other"]["error"] == INTERRUPTED
    assert healed["03_other"]["failed_html"] == "03_other.failed.html"
    index = (out / "index.html").read_text()
    assert "a stale finding" not in index and "not rendered yet" not in index
    assert "value is 42 on demo" in index and "where it stopped" in index and "last good report" in index

    # the failed report removed (as a later good render does): the good one on disk is what counts
    (out / "03_other.failed.html").unlink()
    entry = status_from_reports(out, ["01_ok", "03_other"], healed)["03_other"]
    assert entry["error"] is None and entry["finding"] == "other notebook saw 5"
    assert status_from_reports(out, ["04_never"], {"04_never": {"error": None, "finding": "ghost"}}) == {}
