"""The profile runner: parameters reach the notebook, findings reach the index, failures keep the last good report."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest

from kvstudy.errors import StudyError
from kvstudy.io import file_digest
from kvstudy.report import render as report


def make_notebook(path: Path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "x"  # profile\nfigures_dir = "f"  # figures\nvalue = 1  # a number')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A test report, after seed 000"),
        params,
        nbformat.v4.new_code_cell(body),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


OK_BODY = (
    "from kvstudy.report.notebook import finding, verdict, progress\nimport pandas as pd\n"
    "progress('cell 1 of 1')\nverdict('capacity', f'twice the tokens at {value}')\n"
    "finding(f'value is {value * 2} on {profile}')\n"
    "pd.DataFrame({'tokens': [2097152.0, float('nan')], 'name': ['a', None]})"
)


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    return make_study(tmp_path)


def make_study(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    make_notebook(tmp_path / "notebooks" / "01_ok.ipynb", OK_BODY)
    make_notebook(tmp_path / "notebooks" / "02_broken.ipynb", "raise ValueError('bad data file')")
    make_notebook(tmp_path / "notebooks" / "03_other.ipynb", "print(value)")
    (tmp_path / "profiles" / "demo.yaml").write_text(
        "description: a demo\ndefaults: {value: 5}\nnotebooks:\n  01_ok: {value: 21}\n  02_broken:\n"
    )
    return tmp_path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[report.NotebookRun], str]:
    """The demo profile rendered once (with what it printed), for the tests that only read what it wrote."""
    study = make_study(tmp_path_factory.mktemp("demo"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        runs = report.run_profile("demo", root=study)
    return study, runs, printed.getvalue()


def test_profile_parameters_reach_notebook_and_index(demo: tuple[Path, list[report.NotebookRun], str]) -> None:
    study, (ok, broken), printed = demo
    out_dir = study / "reports" / "demo"
    entry = json.loads((out_dir / "status.json").read_text())["01_ok"]
    assert ok.error is None and entry["finding"] == "value is 42 on demo"
    assert entry["verdicts"] == [
        {"topic": "capacity", "text": "twice the tokens at 21", "state": "measured", "next_step": None, "facts": {}}
    ]
    assert broken.error and "bad data file" in broken.error
    index = (out_dir / "index.html").read_text()
    assert "value is 42 on demo" in index and "01_ok.html" in index
    assert "Decision" in index and "twice the tokens at 21" in index
    # the failed notebook is rendered beside, so the reader sees where it stopped
    assert "failed" in index and "02_broken.failed.html" in index and (out_dir / "02_broken.failed.html").is_file()
    assert "03_other" in index and "not in this profile" in index and not (out_dir / "03_other.html").exists()
    assert "[demo]   01_ok: cell 1 of 1" in printed  # the progress line, streamed


def test_report_html_hides_parameters_and_cleans_tables(demo: tuple[Path, list[report.NotebookRun], str]) -> None:
    study = demo[0]
    page = (study / "reports" / "demo" / "01_ok.html").read_text()
    assert "injected-parameters" not in page and "value = 21" not in page
    assert "given by the profile" in page and "notebook default" not in page.split("| value |")[0]
    assert "2097152.0" not in page and "<td>2097152</td>" in page
    assert "NaN" not in page and "None</td>" not in page and "no value" in page
    assert "<th>0</th>" not in page and "seed 000" not in page and "Fit more users" in page


def test_failed_rerun_keeps_last_good_report(study: Path) -> None:
    report.run_profile("demo", root=study, only=["01_ok"])
    good = (study / "reports" / "demo" / "01_ok.html").read_bytes()
    make_notebook(study / "notebooks" / "01_ok.ipynb", "raise RuntimeError('now broken')")
    (run,) = report.run_profile("demo", root=study, only=["01_ok.ipynb"])
    assert run.error and "now broken" in run.error
    out_dir = study / "reports" / "demo"
    assert (out_dir / "01_ok.html").read_bytes() == good
    index = (out_dir / "index.html").read_text()
    assert "now broken" in index and "last good report" in index
    assert not list((study / "reports").glob(".demo-*")), "the staging folder is removed"


def test_second_run_of_a_profile_is_refused(study: Path) -> None:
    with report.profile_lock(study / "reports", "demo"):
        with pytest.raises(StudyError, match="is being rendered by process"):
            report.run_profile("demo", root=study)


@pytest.mark.parametrize(
    "only, message", [(["01"], "--only '01' is not a notebook of profile"), (["03_other"], "--only '03_other'")]
)
def test_only_names_are_checked(study: Path, only: list[str], message: str) -> None:
    with pytest.raises(StudyError, match=message):
        report.run_profile("demo", root=study, only=only)
    assert not (study / "reports" / "demo" / "index.html").exists()


@pytest.mark.parametrize("name", ["../profiles/demo", "demo.yaml", "/tmp/demo", ""])
def test_profile_must_be_a_name(study: Path, name: str) -> None:
    with pytest.raises(StudyError, match="give the name of a file in profiles/"):
        report.run_profile(name, root=study)


def test_misspelt_parameter_stops_before_anything_runs(study: Path) -> None:
    (study / "profiles" / "typo.yaml").write_text("notebooks:\n  01_ok: {valeu: 3}\n")
    with pytest.raises(StudyError) as info:
        report.run_profile("typo", root=study)
    message = str(info.value)
    assert "typo.yaml" in message and "01_ok" in message and "'valeu'" in message and "'value'" in message
    assert "\n" not in message and not (study / "reports" / "typo").exists()


def test_unknown_profile_names_the_file(study: Path) -> None:
    with pytest.raises(StudyError, match=r"profiles/nope\.yaml: no such profile \(profiles available: demo\)"):
        report.run_profile("nope", root=study)


def test_progress_stream_forwards_only_progress_lines() -> None:
    out = io.StringIO()
    stream = report.ProgressStream("[p] nb:", out)
    stream.write("noise\n[progress] seed 1 of ")
    stream.write("3\nmore noise\n")
    assert out.getvalue() == "[p] nb: seed 1 of 3\n"


def test_file_digest_changes_with_content(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text("1")
    first = file_digest(f)
    f.write_text("2")
    assert file_digest(f) != first and len(first) == 12


def test_status_file_records_each_notebook(demo: tuple[Path, list[report.NotebookRun], str]) -> None:
    study = demo[0]
    status = json.loads((study / "reports" / "demo" / "status.json").read_text())
    assert set(status) == {"01_ok", "02_broken"} and status["02_broken"]["error"]


def test_a_notebook_missing_a_prerequisite_says_what_to_run(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_notebook(
        study / "notebooks" / "02_broken.ipynb",
        "from kvstudy.errors import MissingPrerequisite\n"
        "raise MissingPrerequisite('vLLM not installed in this environment', 'make engine')",
    )
    code = cli_main(["render", "--profile", "demo"], study)
    assert code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("kvstudy: error:")]
    assert lines == [
        "kvstudy: error: notebooks/02_broken.ipynb needs what this machine lacks: "
        "vLLM not installed in this environment; run `make engine`"
    ]
    out_dir = study / "reports" / "demo"
    status = json.loads((out_dir / "status.json").read_text())
    assert status["02_broken"]["needs"] == "make engine" and status["01_ok"]["error"] is None
    index = (out_dir / "index.html").read_text()
    card = index.split('<table class="card">')[1].split("</table>")[0]
    assert "twice the tokens at 21" in card and "<code>make engine</code>" in card  # the failed topic stays in the card
    assert "not run" in index and (out_dir / "01_ok.html").is_file()


def cli_main(argv: list[str], root: Path) -> int:
    """``kvstudy render`` against the test study's folder (the CLI renders the repository's own)."""
    runs = report.run_profile(argv[argv.index("--profile") + 1], root=root)
    return report.report_failures(runs)


def test_progress_stream_names_a_long_running_cell() -> None:
    import time

    out = io.StringIO()
    stream = report.ProgressStream("[p]   nb:", out, every_s=0.05)
    stream.cell_started(3, 7, "# a comment\nrun_sweep(spec)\n")
    deadline = time.monotonic() + 60  # a generous bound: it only catches a ticker that never ticks
    while "notebook cell 3/7 running for" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    stream.close()
    assert "[p]   nb: notebook cell 3/7 running for" in out.getvalue() and out.getvalue().rstrip().endswith(
        "run_sweep(spec)"
    )
