"""Every notebook executes on the reference profile, and none is committed with outputs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvstudy.profiles import load_profile

if TYPE_CHECKING:
    from conftest import Rendered  # tests/notebooks/conftest.py: the one render of the reference profile

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def committed_notebooks() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "notebooks/*.ipynb"], capture_output=True, text=True, check=True
    )
    return [ROOT / line for line in out.stdout.split()]


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 4, [nb.name for nb in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path: Path) -> None:
    nb = json.loads(path.read_text())
    dirty = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs or execution counts"


def test_committed_notebooks_have_no_outputs() -> None:
    for path in committed_notebooks():
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and not cell.get("execution_count"), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_an_id(path: Path) -> None:
    """nbformat 4.5 cells carry ids; without them every render warns (and future nbformat refuses)."""
    nb = json.loads(path.read_text())
    missing = [i for i, cell in enumerate(nb["cells"]) if not cell.get("id")]
    assert not missing, f"{path.name}: cells {missing} have no id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_tagged_parameters_cell(path: Path) -> None:
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected one cell tagged 'parameters'"
    source = "".join(tagged[0]["source"])
    for name in ("profile", "figures_dir"):  # `name = ...` or, typed, `name: str = ...`
        assert re.search(rf"^{name}\s*(:[^=\n]+)?=", source, re.M), f"{path.name}: parameters cell lacks {name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_help_notebook_gives_every_parameter_a_type(path: Path) -> None:
    """`papermill --help-notebook` prints "Unknown type" unless the parameter is annotated (`x: int = 1`);
    the annotation must also name the types the profile checker already accepted."""
    import papermill as pm

    from kvstudy.profiles import declared_parameters

    untyped = [n for n, info in pm.inspect_notebook(str(path)).items() if info["inferred_type_name"] in (None, "None")]
    assert untyped == [], f"{path.name}: parameters without a type for --help-notebook: {untyped}"
    assert all(p.annotation is not None for p in declared_parameters(path).values())


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_on_reference_profile(path: Path, reference: Rendered) -> None:
    run = reference.runs[path.stem]
    assert run.error is None, f"{path.name} failed: {run.error}"
    html = reference.html(path.stem)
    assert html.is_file() and html.stat().st_size > 10_000
    assert reference.finding(path.stem), f"{path.name} states no finding for the index page"
    page = html.read_text(encoding="utf-8").replace("<wbr>", "")
    executed = reference.executed(path.stem).read_text(encoding="utf-8")
    for text, what in ((page, "report"), (executed, "executed notebook")):
        for folder in (ROOT, reference.root):
            assert str(folder) not in text, f"{path.name}: the {what} names the rendering machine's folder {folder}"
        assert str(Path.home()) + "/" not in text, f"{path.name}: the {what} names the home folder"
    assert not unresolved_capture_paths(page), f"{path.name}: names files that are not in the clone"


def unresolved_capture_paths(text: str) -> list[str]:
    """Paths a report names inside a bundled capture folder (``data/captures/<name>/...``) that do not exist."""
    names = {m.rstrip(".,;:)") for m in re.findall(r"(?<![\w./-])(data/captures/[\w.+-]+/[\w./+-]*[\w/])", text)}
    return sorted(
        n
        for n in names
        if (ROOT / n.split("/")[0] / n.split("/")[1] / n.split("/")[2]).is_dir() and not (ROOT / n).exists()
    )


def test_unresolved_capture_paths_can_fail() -> None:
    assert unresolved_capture_paths(
        "log data/captures/speed-cpu/logs/nope.log, ok data/captures/speed-cpu/spec.json"
    ) == ["data/captures/speed-cpu/logs/nope.log"]


def declared_parameters(path: Path) -> set[str]:
    """Names assigned in a notebook's parameters cell."""
    import ast

    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    plain = {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    typed = {
        node.target.id
        for node in tree.body  # `x: int = 20  # comment`
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    return plain | typed


PROFILES = sorted((ROOT / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("profile_path", PROFILES, ids=lambda p: p.stem)
def test_profile_sets_only_declared_parameters(profile_path: Path) -> None:
    """A typo in a profile would otherwise be injected as a new variable and silently ignored."""
    data = load_profile(profile_path.stem, ROOT / "profiles")
    by_stem = {nb.stem: nb for nb in NOTEBOOKS}
    for stem, params in (data.get("notebooks") or {}).items():
        assert stem in by_stem, f"{profile_path.name}: no notebook {stem}"
        declared = declared_parameters(by_stem[stem])
        unknown = set(params or {}) | set(data.get("defaults") or {})
        unknown -= declared
        assert not unknown, f"{profile_path.name}: {stem} does not declare {sorted(unknown)}"
