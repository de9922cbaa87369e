"""Secrets by shape reach no file a render writes (issue 25): a profile's description, a failing
notebook's error text and outputs quoting part of a secret-bearing value (a token-shaped folder
name, a URL password) are redacted in index.html, status.json, the HTML, the executed notebook and
the figures' CSVs."""

from __future__ import annotations

from pathlib import Path

import nbformat

from kvstudy.report import render as report

TOKEN = "hf_PlantedTok0a1b2c3d4e5f6"  # shaped like a Hugging Face token
PASSWORD = "plantedUrlPw-5d7e"
ERROR_TOKEN = "ghp_PlantedErr9z8y7x6w5v"
DESCRIPTION_TOKEN = "sk-PlantedDesc4q3r2s1t"
PLANTED = (TOKEN, PASSWORD, ERROR_TOKEN, DESCRIPTION_TOKEN)

OK_BODY = (
    "from pathlib import Path\nimport pandas as pd\nfrom kvstudy.redact import write_csv\n"
    "from kvstudy.report.notebook import finding\n"
    "name = Path(model).name\nprint('serving', name)\n"  # part of the value: the folder's own name
    "print('mirror', endpoint.replace('hub.example', 'mirror.example/v2'))\n"  # a longer URL
    "write_csv(pd.DataFrame({'model': [name]}), figures_dir, 'models')\n"
    "finding(f'served {name}')"
)
FAILING_BODY = f"raise RuntimeError(f'cannot reach {{endpoint}} for models/run_{ERROR_TOKEN}-x')"


def _notebook(path: Path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'profile = "x"  # profile\nfigures_dir = "f"  # figures\nmodel = ""  # a folder\nendpoint = ""  # a URL'
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Redaction"), params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_secret_shapes_reach_no_file_a_render_writes(tmp_path: Path) -> None:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    _notebook(tmp_path / "notebooks" / "01_ok.ipynb", OK_BODY)
    _notebook(tmp_path / "notebooks" / "02_fails.ipynb", FAILING_BODY)
    (tmp_path / "profiles" / "planted.yaml").write_text(
        f"description: 'our models, read with {DESCRIPTION_TOKEN}'\n"
        f"defaults: {{model: 'models/{TOKEN}-model', endpoint: 'https://user:{PASSWORD}@hub.example'}}\n"
        "notebooks:\n  01_ok:\n  02_fails:\n"
    )
    runs = report.run_profile("planted", root=tmp_path)
    assert [r.error is None for r in runs] == [True, False]
    written = [p for folder in ("reports", "figures") for p in (tmp_path / folder).rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"index.html", "status.json", "01_ok.html", "01_ok.ipynb", "02_fails.failed.html", "models.csv"} <= names
    leaks = sorted((p.name, value) for p in written for value in PLANTED if value in p.read_text(errors="replace"))
    assert leaks == []
    index = (tmp_path / "reports" / "planted" / "index.html").read_text()
    assert "our models, read with [REDACTED]" in index and "cannot reach https://user:[REDACTED]@hub.example" in index
    assert "[REDACTED]-model" in (tmp_path / "figures" / "planted" / "models.csv").read_text()


def test_every_csv_is_written_without_secret_shapes(tmp_path: Path) -> None:
    import pandas as pd

    from kvstudy.redact import write_csv

    frame = pd.DataFrame({"model": [f"models/run_{TOKEN}-x"], "source": [f"https://u:{PASSWORD}@hub.example/m"]})
    text = write_csv(frame, tmp_path, "table").read_text()
    assert TOKEN not in text and PASSWORD not in text and text.count("[REDACTED]") == 2
