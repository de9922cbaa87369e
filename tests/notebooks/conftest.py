"""The reference profile rendered once per test run, shared by every notebook test.

`kvstudy render --profile reference` runs in a temporary copy of the repository (its entries
symlinked, except ``reports``, ``figures`` and ``.git``), so a colleague's `make all` is not
disturbed; the tests read its reports, executed notebooks, figures and CSVs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstudy.report import render
from kvstudy.report.render import NotebookRun

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Rendered:
    """One render of the reference profile."""

    root: Path  # the copy of the repository it ran in
    runs: dict[str, NotebookRun]  # by notebook stem

    @property
    def reports(self) -> Path:
        return self.root / "reports" / "reference"

    @property
    def figures(self) -> Path:
        return self.root / "figures" / "reference"

    def html(self, stem: str) -> Path:
        return self.reports / f"{stem}.html"

    def executed(self, stem: str) -> Path:
        return self.reports / f"{stem}.ipynb"

    def finding(self, stem: str) -> str | None:
        """The notebook's finding as the render recorded it in ``status.json``."""
        finding: str | None = json.loads((self.reports / "status.json").read_text())[stem].get("finding")
        return finding


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test of the one render is a ``notebooks`` test: ``make test`` runs those in one process (the
    render happens once there), the other tests without vLLM on every CPU (pytest-xdist)."""
    if "reference" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.notebooks)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    root = tmp_path_factory.mktemp("study")
    for entry in ROOT.iterdir():
        if entry.name not in {"reports", "figures", ".git"}:
            (root / entry.name).symlink_to(entry)
    runs = render.run_profile("reference", root=root)
    return Rendered(root, {run.name: run for run in runs})
