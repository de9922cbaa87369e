"""The profile runner: parameters reach the notebook, findings reach the index, failures are kept."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kvstudy import render as report
from kvstudy.io import file_digest
from kvstudy.errors import StudyError


def make_notebook(path: Path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "x"  # profile\nfigures_dir = "f"  # figures\nvalue = 1  # a number')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A test report"), params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    make_notebook(tmp_path / "notebooks" / "01_ok.ipynb",
                  "from kvstudy.notebook import finding\nfinding(f'value is {value * 2} on {profile}')")
    make_notebook(tmp_path / "notebooks" / "02_broken.ipynb", "raise ValueError('bad data file')")
    (tmp_path / "profiles" / "demo.yaml").write_text(
        "description: a demo\ndefaults: {value: 5}\nnotebooks:\n  01_ok: {value: 21}\n")
    return tmp_path


def test_profile_parameters_reach_notebook_and_index(study: Path) -> None:
    runs = report.run_profile("demo", root=study)
    ok, broken = runs
    assert ok.error is None and ok.finding == "value is 42 on demo"
    assert broken.error and "bad data file" in broken.error
    # the failed notebook is still rendered, so the reader sees where it stopped
    assert broken.html_path.is_file()
    index = (study / "reports" / "demo" / "index.html").read_text()
    assert "value is 42 on demo" in index and "01_ok.html" in index
    assert "failed" in index and "02_broken.html" in index


def test_unknown_profile_names_the_file(study: Path) -> None:
    with pytest.raises(StudyError, match=r"profiles/nope\.yaml: no such profile \(profiles available: demo\)"):
        report.run_profile("nope", root=study)


def test_profile_naming_missing_notebook_is_rejected(study: Path) -> None:
    (study / "profiles" / "bad.yaml").write_text("notebooks:\n  09_missing: {}\n")
    with pytest.raises(StudyError, match="09_missing"):
        report.run_profile("bad", root=study)


@pytest.mark.parametrize("text, message", [
    ("defaults: [1, 2]\n", "field 'defaults' must be a mapping"),
    ("- a\n- b\n", "expected a mapping"),
    ("defaults: {a: 1\n", "malformed YAML"),
])
def test_malformed_profile(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(StudyError, match=message):
        report.load_profile("p", tmp_path)


def test_notebook_parameters_merge_order() -> None:
    data = {"defaults": {"a": 1, "b": 2}, "notebooks": {"nb": {"b": 3}}}
    params = report.notebook_parameters(data, "nb", "prof", Path("figures/prof"))
    assert params == {"a": 1, "b": 3, "profile": "prof", "figures_dir": "figures/prof"}


def test_file_digest_changes_with_content(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text("1")
    first = file_digest(f)
    f.write_text("2")
    assert file_digest(f) != first and len(first) == 12
