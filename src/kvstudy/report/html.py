"""HTML a reader trusts: each executed notebook as a report page, and the profile's index page.

A report page (what ``kvstudy render`` does to an executed notebook):

- the ``parameters`` and ``injected-parameters`` cells are removed and, unless the notebook showed its
  own ``settings_table``, a settings table (name, value, origin) takes their place;
- source documents are named by title instead of "seed 000";
- the page is nbconvert's lab template extended by ``templates/report.html.j2`` (its style sheet wraps
  long text in cells and keeps tables and figures inside the page); the tables themselves come
  shaped from the kernel (:func:`kvstudy.report.notebook.styled`: no row numbers, a dash for a missing value).

The index page, from a Jinja2 template (autoescaped): the decision card (the answer, its reason and
the evidence table above the fold), the topics, the published guidance, one line per notebook, what
is not in the profile.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup, escape

from kvstudy import decision_rule as rule
from kvstudy.errors import StudyError
from kvstudy.io import read_json
from kvstudy.machine import cpu_model, package_versions
from kvstudy.profiles import RUNNER_PARAMETERS
from kvstudy.redact import write_csv, write_scrubbed
from kvstudy.report.decision import card_from_status
from kvstudy.report.notebook import (
    CSV_NOTE,
    DEFAULT,
    FINDING_KEY,
    GIVEN,
    SETTINGS_KEY,
    SOURCE_TITLES,
    VERDICT_KEY,
    git_commit,
    markdown_table,
    utc_stamp,
)

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
    import nbformat  # here, not at module level: it loads jsonschema, seconds of the CLI's start

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
        exclude_input=True,  # code stays in the executed notebook
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb)
    write_scrubbed(html_path, body)


# --------------------------------------------------------------------------- the index page

TEMPLATE = "index.html.j2"
ANSWER_CLASS = {rule.TURN_ON: "on", rule.KEEP: "keep", rule.UNDECIDED: "open"}
_EMPHASIS = re.compile(r"(\*\*|__)(.+?)\1|(?<![\w*])\*(?!\s)([^*]+?)(?<!\s)\*(?![\w*])")


def prose(text: Any) -> Markup:
    """Report text for HTML: sources by title, markdown emphasis dropped (never shown as asterisks),
    escaped, `backquoted` commands as code."""
    plain = _EMPHASIS.sub(lambda m: m.group(2) or m.group(3), name_sources(str(text)))
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(plain))))


INTERRUPTED = "the render was interrupted before it recorded why this notebook failed"
TORN = "the render was interrupted while it published this report"


def _failed(page: Path, error: str) -> dict[str, Any]:
    """The status entry of a render that stopped at ``page`` (its time the page's)."""
    stamp = utc_stamp(page.stat().st_mtime)
    return {"seconds": None, "rendered": stamp, "error": error, "needs": None, "failed_html": page.name}


def extract_results(notebook_path: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """The notebook's finding and its structured verdicts (``notebook.verdict``), in order."""
    nb = read_json(notebook_path)
    finding, verdicts = None, []
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            meta = output.get("metadata") or {}
            if meta.get(FINDING_KEY) and finding is None:
                finding = str(meta[FINDING_KEY])
            item = meta.get(VERDICT_KEY)
            if isinstance(item, dict) and item.get("text"):
                verdicts.append({**item, "topic": str(item.get("topic", "")), "text": str(item["text"])})
    return finding, verdicts


def status_from_reports(out_dir: Path, stems: Sequence[str], status: dict[str, Any]) -> dict[str, Any]:
    """Each notebook's status entry as the reports in ``out_dir`` say it: the newer of its last good
    report (finding and verdicts read back from its executed notebook) and its failed one, with what
    ``status`` recorded about that render kept where it agrees. A render killed between moving a
    report and writing ``status.json`` leaves the two contradicting; this is what heals them."""
    healed: dict[str, Any] = {}
    for stem in stems:
        entry = dict(status.get(stem) or {})
        good, executed, failed = (out_dir / f"{stem}{s}" for s in (".html", ".ipynb", ".failed.html"))
        good_at = good.stat().st_mtime if good.is_file() and executed.is_file() else None
        failed_at = failed.stat().st_mtime if failed.is_file() else None
        if failed_at is not None and (good_at is None or failed_at >= good_at):
            healed[stem] = {**entry, "failed_html": failed.name} if entry.get("error") else _failed(failed, INTERRUPTED)
        elif good.is_file():
            try:
                found, verdicts = extract_results(executed)
            except StudyError:  # the report without its executed notebook, or a torn one: say so
                why = "missing" if not executed.is_file() else "unreadable"
                healed[stem] = _failed(
                    good, f"{TORN} (its executed notebook {executed.name} is {why}): render it again"
                )
                continue
            agrees = bool(entry) and not entry.get("error")
            healed[stem] = {
                "seconds": entry.get("seconds") if agrees else None,
                "rendered": (agrees and entry.get("rendered")) or utc_stamp(good.stat().st_mtime),
                "error": None,
                "finding": found,
                "verdicts": verdicts,
            }
    return healed


def write_index(
    out_dir: Path,
    profile: str,
    profile_data: dict[str, Any],
    all_stems: Sequence[str],
    status: dict[str, Any],
    secrets: list[str] | None = None,
) -> Path:
    """Write ``index.html`` (atomically, scrubbed of every secret shape and of the literal ``secrets``)
    for the profile's notebooks (``status``: their entries, from :func:`status_from_reports`)."""
    stems = [s for s in all_stems if s in profile_data["notebooks"]]
    absent = [s for s in all_stems if s not in profile_data["notebooks"]]
    for stem in absent:  # reports of notebooks not in the profile: none is taken for its results
        for suffix in (".html", ".ipynb", ".failed.html", ".failed.ipynb"):
            (out_dir / f"{stem}{suffix}").unlink(missing_ok=True)
    items = [(stem, status.get(stem) or {}) for stem in stems]
    card = card_from_status(profile, status, list(stems), profile_data.get("decision"))
    thresholds = ", ".join(f"{k} {v}" for k, v in card.thresholds.items() if v is not None)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters.update(prose=prose, capfirst=lambda t: str(t)[:1].upper() + str(t)[1:])
    page = env.get_template(TEMPLATE).render(
        profile=profile,
        extends=profile_data.get("extends"),
        card=card,
        answer_class=ANSWER_CLASS.get(card.decision.answer, "open"),
        thresholds=thresholds,
        items=items,
        absent=absent,
        reports={p.name for p in out_dir.glob("*.html")},
        description=name_sources(str(profile_data.get("description") or "")),
        stamp=utc_stamp(),
        commit=git_commit(),
        cpu=cpu_model(),
        versions=", ".join(f"{k} {v}" for k, v in package_versions().items()),
    )
    path = out_dir / "index.html"
    write_scrubbed(path, page, secrets)
    return path
