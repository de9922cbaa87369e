"""Planted secrets in a profile (issue 10): a secret given as a parameter value never reaches the
executed notebook or the HTML, and a ``{from_env: NAME}`` value is never resolved into either."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from kvstudy.report import render as report

PLANTED = {
    "by_name": "plantedProfTok-3b9e71",
    "by_url": "plantedProfPw-88c1d2",
    "by_arg": "plantedProfArg-0a7f55",
    "from_env": "plantedProfEnv-6e2c40",
}
BODY = (
    "print(server_env)\nprint(extra_args)\nprint(endpoint)\n"
    "from kvstudy.report.notebook import finding\nfinding(f'{len(server_env)} variables')"
)


def _study(root: Path) -> Path:
    (root / "notebooks").mkdir()
    (root / "profiles").mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'profile = "x"  # profile\nfigures_dir = "f"  # figures\n'
        "server_env = {}  # server environment\nextra_args = []  # server arguments\n"
        'endpoint = ""  # a URL'
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Secrets"), params, nbformat.v4.new_code_cell(BODY)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "notebooks" / "01_secrets.ipynb")
    (root / "profiles" / "planted.yaml").write_text(
        "description: planted secrets\nnotebooks:\n  01_secrets:\n"
        f"    server_env: {{MY_SERVICE_TOKEN: {PLANTED['by_name']}, HF_TOKEN: {{from_env: KVSTUDY_PLANTED_SOURCE}}}}\n"
        f"    extra_args: [--api-key, {PLANTED['by_arg']}]\n"
        f"    endpoint: 'https://user:{PLANTED['by_url']}@hub.example'\n"
    )
    return root


def test_profile_secrets_reach_neither_notebook_nor_html(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTUDY_PLANTED_SOURCE", PLANTED["from_env"])
    (run,) = report.run_profile("planted", root=_study(tmp_path))
    status = json.loads((tmp_path / "reports" / "planted" / "status.json").read_text())
    assert run.error is None and status["01_secrets"]["finding"] == "2 variables"
    written = [p for p in (tmp_path / "reports").rglob("*") if p.is_file()]
    assert any(p.suffix == ".ipynb" for p in written) and any(p.suffix == ".html" for p in written)
    leaks = [(p.name, channel) for p in written for channel, value in PLANTED.items() if value in p.read_text()]
    assert leaks == []
    executed = (tmp_path / "reports" / "planted" / "01_secrets.ipynb").read_text()
    assert "KVSTUDY_PLANTED_SOURCE" in executed  # the reference is kept, never its value


def test_secret_parameter_values_finds_names_shapes_and_arguments() -> None:
    values = report.secret_parameter_values(
        {
            "env": {"DB_PASSWORD": "hunter22", "N": "12345"},
            "args": ["--hf-token", "abcdef1"],
            "ref": {"from_env": "X"},
            "url": "https://u:pw1234@h",
        }
    )
    assert set(values) == {"hunter22", "abcdef1", "https://u:pw1234@h"}
