"""HTML a reader trusts, for every notebook at once: what ``kvstudy render`` does to an executed notebook.

- the ``parameters`` and ``injected-parameters`` cells are removed and, unless the notebook showed its
  own ``settings_table``, a settings table (name, value, origin) takes their place;
- source documents are named by title instead of "seed 000";
- the page is nbconvert's lab template extended by ``templates/report.html.j2`` (its style sheet wraps
  long text in cells and keeps tables and figures inside the page); the tables themselves come
  shaped from the kernel (:func:`kvstudy.report.notebook.styled`: no row numbers, a dash for a missing value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvstudy.profiles import RUNNER_PARAMETERS
from kvstudy.redact import write_csv, write_scrubbed
from kvstudy.report.notebook import CSV_NOTE, DEFAULT, GIVEN, SETTINGS_KEY, SOURCE_TITLES, markdown_table

HIDDEN_TAGS = {"parameters", "injected-parameters"}
RUNNER_SET = "set by the runner"
SEED = re.compile(r"\b[Ss]eed (00\d)\b")
TEMPLATES = Path(__file__).resolve().parents[1] / "templates"  # package data (pyproject)


def name_sources(text: str) -> str:
    """``text`` with "seed 000" style references replaced by the document's title."""
    return SEED.sub(lambda m: SOURCE_TITLES.get(f"seed {m.group(1)}", m.group(0)), text)


def settings_markdown(values: Mapping[str, Any], given: set[str], folder: Path, name: str, shown_folder: str) -> str:
    """A settings table (name, value, origin) for the parameters a notebook ran with, also written as
    ``<folder>/<name>.csv`` (named under the table, in ``shown_folder``)."""
    import pandas as pd

    records = [
        (
            k,
            v if isinstance(v, str) else json.dumps(v),
            RUNNER_SET if k in RUNNER_PARAMETERS else GIVEN if k in given else DEFAULT,
        )
        for k, v in values.items()
    ]
    frame = pd.DataFrame(records, columns=["setting", "value", "origin"])
    path = write_csv(frame, folder, name)
    cells = []
    for key, shown, origin in records:
        if len(shown) > 300:
            shown = shown[:300] + " … (full list in the executed notebook)"
        cells.append((key, "`" + shown.replace("|", "\\|").replace("`", "'") + "`", origin))
    note = f'<p class="kvstudy-note {CSV_NOTE}">As CSV: <code>{shown_folder}{path.name}</code></p>'
    return markdown_table("**Settings** (origin: given by the profile, or the notebook's default)", frame, cells, note)


def prepare(nb: Any, values: Mapping[str, Any], given: set[str], csv: tuple[Path, str, str]) -> Any:
    """The notebook as the HTML shows it (see the module docstring); ``nb`` is changed in place.
    ``csv``: (folder, name, folder as shown) where the settings table the renderer adds is also written as CSV."""
    import nbformat

    outputs = [out for cell in nb.cells for out in cell.get("outputs", []) or []]
    own_settings = any((out.get("metadata") or {}).get(SETTINGS_KEY) for out in outputs)  # notebook.settings_table
    cells = []
    for cell in nb.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code" and tags & HIDDEN_TAGS:
            if "parameters" in tags and not own_settings:
                cells.append(nbformat.v4.new_markdown_cell(settings_markdown(values, given, *csv)))
            continue
        if cell.cell_type == "markdown":
            cell.source = name_sources(cell.source)
        if cell.cell_type == "code":
            cell.metadata.setdefault("transient", {})["remove_source"] = True
        cells.append(cell)
    nb.cells = cells
    for output in outputs:
        data = output.get("data") or {}  # nbformat.read joins multi-line texts into one string
        for mime in ("text/html", "text/markdown"):
            if mime in data:
                data[mime] = name_sources(data[mime])
        if output.get("output_type") == "stream":
            output["text"] = name_sources(output.get("text", ""))
    return nb


def render_html(
    notebook_path: Path, html_path: Path, values: Mapping[str, Any], given: set[str], csv: tuple[Path, str, str]
) -> None:
    """Render an executed notebook as the report HTML (prose, tables, figures; no code)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = prepare(nbformat.read(notebook_path, as_version=4), values, given, csv)
    exporter = HTMLExporter(
        template_name="lab",
        template_file="report.html.j2",
        extra_template_paths=[str(TEMPLATES)],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb)
    write_scrubbed(html_path, body)
