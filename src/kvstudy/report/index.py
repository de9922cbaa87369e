"""The index page of a profile's reports, from a Jinja2 template (autoescaped): the decision card (the
answer, its reason and the evidence table above the fold), the topics, the published guidance, one
line per notebook, what is not in the profile."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from kvstudy import decision_rule as rule
from kvstudy.errors import StudyError
from kvstudy.io import read_json
from kvstudy.machine import cpu_model, package_versions
from kvstudy.redact import write_scrubbed
from kvstudy.report.decision import card_from_status
from kvstudy.report.html import TEMPLATES, name_sources
from kvstudy.report.notebook import FINDING_KEY, VERDICT_KEY, git_commit, utc_stamp

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
        answer_class=ANSWER_CLASS.get(card.answer, "open"),
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
