"""Hostile inputs around a render (issue 30's second corpus, issue 35 item 3): a planted lock link, a
profile smuggled in through ONLY, a torn or tampered status.json, a report left without its notebook."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.unit.test_render import OK_BODY, make_notebook

from kvstudy import cli
from kvstudy.errors import StudyError
from kvstudy.report import decision
from kvstudy.report import render as report


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    make_notebook(tmp_path / "notebooks" / "01_ok.ipynb", OK_BODY)
    make_notebook(
        tmp_path / "notebooks" / "03_other.ipynb", "from kvstudy.report.notebook import finding\nfinding('other')"
    )
    (tmp_path / "profiles" / "demo.yaml").write_text("description: d\nnotebooks:\n  01_ok: {value: 21}\n  03_other:\n")
    return tmp_path


def test_a_planted_lock_link_is_refused_and_its_target_kept(study: Path) -> None:
    outside = study / "outside.txt"
    outside.write_text("keep me")
    (study / "reports").mkdir()
    (study / "reports" / ".demo.lock").symlink_to(outside)
    with pytest.raises(StudyError, match=r"\.demo\.lock: cannot be used as the render's lock \(a symbolic link\)"):
        report.run_profile("demo", root=study)
    assert outside.read_text() == "keep me" and not (study / "reports" / "demo").exists()


def test_a_second_profile_smuggled_through_only_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["render", "--profile", "reference", "--only", "01_capacity-math", "--profile", "other"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--profile given twice" in err and "Traceback" not in err


def test_a_torn_status_is_said_and_rebuilt_keeping_every_notebook(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report.run_profile("demo", root=study)
    out = study / "reports" / "demo"
    for torn in ('{"01_ok": {"error": nu', '{"03_other": "a string", "01_ok": {}}', '{"01_ok": {"verdicts": 5}}'):
        (out / "status.json").write_text(torn)
        capsys.readouterr()
        report.run_profile("demo", root=study, only=["01_ok"])
        assert "rebuilding it from the reports on disk" in capsys.readouterr().out
        status = json.loads((out / "status.json").read_text())
        assert status["03_other"]["finding"] == "other" and status["01_ok"]["error"] is None
        assert "03_other &mdash; not rendered yet" not in (out / "index.html").read_text()


def test_a_report_without_its_executed_notebook_is_not_called_never_rendered(study: Path) -> None:
    report.run_profile("demo", root=study)
    out = study / "reports" / "demo"
    (out / "03_other.ipynb").unlink()  # what a kill -9 between moving the two files leaves
    (out / "status.json").unlink()
    report.run_profile("demo", root=study, only=["01_ok"])
    entry = json.loads((out / "status.json").read_text())["03_other"]
    assert (
        "interrupted while it published this report" in entry["error"] and "03_other.ipynb is missing" in entry["error"]
    )
    index = (out / "index.html").read_text()
    assert "not rendered yet" not in index and "render it again" in index


@pytest.mark.parametrize(
    "status, message",
    [
        ({"01_ok": "a string"}, r"status.json: 01_ok: expected a valid dictionary, got 'a string'"),
        ({"01_ok": {"verdicts": 5}}, r"status.json: 01_ok.verdicts: expected a valid list, got 5"),
        ({"01_ok": {"verdicts": ["x"]}}, r"01_ok.verdicts\[0\]: expected a valid dictionary"),
        ({"01_ok": {"error": ["x"]}}, r"01_ok.error: expected a valid string, got a list"),
        ({"01_ok": {"verdicts": [{"facts": 3}]}}, r"01_ok.verdicts\[0\].facts: expected a valid dictionary"),
        ({"01_ok": {"seconds": True}}, r"01_ok.seconds: expected a valid number, got True"),
        ([1, 2], r"status.json: expected a valid dictionary, got a list"),
    ],
)
def test_verdict_refuses_a_tampered_status_in_one_line(study: Path, status: object, message: str) -> None:
    (study / "reports" / "demo").mkdir(parents=True)
    (study / "reports" / "demo" / "status.json").write_text(json.dumps(status))
    with pytest.raises(StudyError, match=message) as info:
        decision.read_card("demo", study)
    assert "\n" not in str(info.value)


def test_verdict_json_prints_no_nan(
    study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (study / "reports" / "demo").mkdir(parents=True)
    verdict = {"topic": "capacity", "text": "t", "state": "computed", "facts": {"share": math.nan, "x": math.inf}}
    (study / "reports" / "demo" / "status.json").write_text(json.dumps({"01_ok": {"verdicts": [verdict]}}))
    read = decision.read_card
    monkeypatch.setattr(decision, "read_card", lambda profile: read(profile, study))
    assert cli.main(["verdict", "demo", "--json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["lines"][0]["facts"] == {"share": None, "x": None}


SLOW_CLEANUP = (
    "import time\nfrom kvstudy.report.notebook import progress\nprogress('serving')\n"
    "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    time.sleep(4)  # a server being stopped\n    raise\n"
)


def test_ctrl_c_during_a_render_is_one_line_and_exit_130(study: Path) -> None:
    """Issue 35 item 6: Ctrl-C while a cell cleans up (a vLLM server being stopped) printed the kernel's
    ZMQ traceback when its reply socket closed; now one line and exit 130."""
    make_notebook(study / "notebooks" / "01_ok.ipynb", SLOW_CLEANUP)
    code = (
        "import sys; from pathlib import Path; from kvstudy import cli\nfrom kvstudy.report import render\n"
        "render.run_profile.__defaults__ = (Path(sys.argv[1]), ())  # the test's study, not the repository\n"
        "sys.exit(cli.main(['render', '--profile', 'demo', '--only', '01_ok']))"
    )
    root = Path(report.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(study)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own group, as a terminal's: Ctrl-C reaches the kernel too
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    seen = ""
    while "serving" not in seen:
        line = proc.stdout.readline().decode()
        assert line, seen
        seen += line
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out = seen + proc.communicate(timeout=60)[0].decode()  # until the kernel, which shares the pipe, is gone too
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "ZMQError" not in out, out
    assert out.strip().splitlines()[-1] == "kvstudy: interrupted", out
