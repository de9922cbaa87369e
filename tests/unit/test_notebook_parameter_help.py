"""A spec-filling notebook's parameter comments are its spec's field descriptions, word for word.

``scripts/notebook_parameter_help.py`` writes them; these tests fail when a committed notebook's
comment (what ``papermill --help-notebook`` prints) drifts from the declaration.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import papermill as pm
import pytest

from kvstudy.io import REPO_ROOT
from kvstudy.profiles import SPECS
from kvstudy.speed.spec import SweepSpec

_script = importlib.util.spec_from_file_location(
    "notebook_parameter_help", REPO_ROOT / "scripts" / "notebook_parameter_help.py"
)
assert _script is not None and _script.loader is not None
generator = importlib.util.module_from_spec(_script)
_script.loader.exec_module(generator)


def _fields(stem: str) -> dict[str, str]:
    """The spec fields the notebook declares as parameters, with their descriptions."""
    declared = pm.inspect_notebook(str(REPO_ROOT / "notebooks" / f"{stem}.ipynb"))
    spec = SPECS[stem].model_fields
    return {name: spec[name].description or "" for name in declared if name in spec}


@pytest.mark.parametrize("stem", sorted(SPECS))
def test_parameter_comment_is_the_field_description(stem: str) -> None:
    fields = _fields(stem)
    assert len(fields) >= 10  # the notebook does fill its spec
    declared = pm.inspect_notebook(str(REPO_ROOT / "notebooks" / f"{stem}.ipynb"))
    drifted = {name: declared[name]["help"] for name, text in fields.items() if declared[name]["help"] != text}
    assert not drifted, f"run scripts/notebook_parameter_help.py: {drifted}"


@pytest.mark.parametrize("stem", sorted(SPECS))
def test_papermill_help_notebook_prints_each_description(stem: str) -> None:
    path = REPO_ROOT / "notebooks" / f"{stem}.ipynb"
    out = subprocess.run(
        [sys.executable, "-m", "papermill", "--help-notebook", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    shown = " ".join(out.split())  # click may wrap long lines
    for name, text in _fields(stem).items():
        assert " ".join(text.split()) in shown, name


def test_generator_rewrites_only_spec_field_comments() -> None:
    source = "\n".join(
        [
            'profile: str = "reference"  # not a field: left alone',
            'input_len: "Optional[int]" = None  # an old text',
            'server_env: "Optional[dict]" = {"A": "#1"}',
            "# a comment line: left alone",
        ]
    )
    lines = generator.with_help(source, SweepSpec).split("\n")
    assert lines[0] == 'profile: str = "reference"  # not a field: left alone'
    assert lines[1] == f'input_len: "Optional[int]" = None  # {SweepSpec.model_fields["input_len"].description}'
    assert (
        lines[2]
        == f'server_env: "Optional[dict]" = {{"A": "#1"}}  # {SweepSpec.model_fields["server_env"].description}'
    )
    assert lines[3] == "# a comment line: left alone"
