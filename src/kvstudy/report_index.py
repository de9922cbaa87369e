"""The index page of a profile's reports: a verdict card, one line per notebook, what is not in it."""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.decision import card_from_status
from kvstudy.errors import StudyError
from kvstudy.machine import REPORT_PACKAGES, cpu_model, package_versions
from kvstudy.notebook import git_commit
from kvstudy.redact import write_scrubbed
from kvstudy.report_html import extract_results, name_sources

STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.5}
li{margin:.6em 0}.meta{color:#555;font-size:.9em}.failed{color:#a00}.absent{color:#777}
.decision{border:1px solid #ccc;border-radius:6px;padding:.6em 1.2em;background:#f8f8f8;font-size:1.05em}
table.card{border-collapse:collapse;width:100%;table-layout:fixed;font-size:.92em}
table.card th,table.card td{border-top:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top;
overflow-wrap:anywhere}table.card thead th{border-bottom:2px solid #bbb}
table.card :is(th,td):nth-child(1){width:15%}table.card :is(th,td):nth-child(2){width:10%}
table.card :is(th,td):nth-child(4){width:25%}
.state-measured,.state-computed{color:#060}.state-no-claim,.state-not-measured{color:#a60}"""


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _code(text: str) -> str:
    """Escaped text with `backquoted` commands shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _card(profile: str, stems: Sequence[str], status: dict[str, Any]) -> str:
    """The decision card (``kvstudy.decision``): one line of decision, then each topic's verdict with how
    sure the study is and what would settle it, then the published usage guidance on this model."""
    card = card_from_status(profile, status, list(stems))
    if not card.lines:
        return ""
    rows = []
    for line in card.lines:
        step = _code(line.next_step) if line.next_step else ""
        link = f" ({_link(line.link, 'report')})" if line.link else ""
        rows.append(
            f'<tr><th scope="row">{html.escape(line.topic)}</th>'
            f'<td class="state state-{html.escape(line.state.replace(" ", "-"))}">{html.escape(line.state)}</td>'
            f"<td>{_code(name_sources(line.text))}{link}</td>"
            f"<td>{step}</td></tr>"
        )
    guidance = []
    for g in card.guidance:
        mark = {True: "applies", False: "does not apply", None: "cannot tell"}[g.applies]
        guidance.append(
            f'<tr><th scope="row">{html.escape(g.scenario)}</th><td>{mark}</td><td>{html.escape(g.why)}</td>'
            f"<td>{html.escape(g.published)}</td></tr>"
        )
    return (
        f'<h2>Decision</h2>\n<p class="decision">{_code(name_sources(card.decision))}</p>\n'
        '<table class="card"><thead><tr><th>topic</th><th>how sure</th><th>what the study found</th>'
        "<th>what would settle it</th></tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table>\n"
        "<h3>Published usage guidance, evaluated on this model</h3>\n"
        '<p class="meta">The usage table of vLLM\'s FP8 KV-cache update (seed 003), row by row, against this '
        "model's config and the profile's context length.</p>\n"
        '<table class="card"><thead><tr><th>scenario</th><th>here</th><th>why</th><th>published recommendation</th>'
        "</tr></thead><tbody>\n" + "\n".join(guidance) + "\n</tbody></table>"
    )


def _line(stem: str, entry: dict[str, Any], out_dir: Path) -> str:
    """One notebook's line: its finding, or that it failed (with the last good report if there is one)."""
    if not entry:
        return f"<li>{html.escape(stem)} &mdash; not rendered yet for this profile</li>"
    if entry.get("error"):
        state = "not run" if entry.get("needs") else "failed"
        parts = [
            f'<span class="failed"><strong>{state}</strong> ({html.escape(entry["rendered"])}): '
            f"{html.escape(entry['error'])}</span>",
            _link(entry["failed_html"], "where it stopped"),
        ]
        if entry.get("needs"):
            parts.insert(1, f"run <code>{html.escape(entry['needs'])}</code> to provide it")
        if (out_dir / f"{stem}.html").exists() and entry["failed_html"] != f"{stem}.html":
            parts.append(_link(f"{stem}.html", "last good report") + " (older run)")
        return f"<li>{html.escape(stem)} &mdash; " + "; ".join(parts) + "</li>"
    finding = name_sources(entry.get("finding") or "(the notebook stated no finding)")
    return (
        f"<li>{_link(stem + '.html', stem)} ({_link(stem + '.ipynb', 'notebook with code')}) "
        f"<details><summary>its finding</summary>{html.escape(finding)}</details></li>"
    )


INTERRUPTED = "the render was interrupted before it recorded why this notebook failed"
TORN = "the render was interrupted while it published this report"


def _stamp(path: Path) -> str:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


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
            if not entry.get("error"):
                entry = {"seconds": None, "rendered": _stamp(failed), "error": INTERRUPTED, "needs": None}
            healed[stem] = {**entry, "failed_html": failed.name}
        elif good.is_file():
            try:
                found, verdicts = extract_results(executed)
            except StudyError:  # the report without its executed notebook, or a torn one: say so
                why = "missing" if not executed.is_file() else "unreadable"
                healed[stem] = {
                    "seconds": None,
                    "rendered": _stamp(good),
                    "error": f"{TORN} (its executed notebook {executed.name} is {why}): render it again",
                    "needs": None,
                    "failed_html": good.name,
                }
                continue
            agrees = bool(entry) and not entry.get("error")
            healed[stem] = {
                "seconds": entry.get("seconds") if agrees else None,
                "rendered": entry.get("rendered") if agrees and entry.get("rendered") else _stamp(good),
                "error": None,
                "finding": found,
                "verdicts": verdicts,
            }
    return healed


def _remove_stale(out_dir: Path, stems: Sequence[str]) -> None:
    """Remove reports of notebooks that are not in the profile, so none is taken for its results."""
    for stem in stems:
        for suffix in (".html", ".ipynb", ".failed.html", ".failed.ipynb"):
            (out_dir / f"{stem}{suffix}").unlink(missing_ok=True)


def write_index(
    out_dir: Path,
    profile: str,
    profile_data: dict[str, Any],
    all_stems: Sequence[str],
    status: dict[str, Any],
    secrets: list[str] | None = None,
) -> Path:
    """Write ``index.html`` (atomically, scrubbed of every secret shape and of the literal ``secrets``)
    for the profile's notebooks; drop entries of other notebooks."""
    stems = [s for s in all_stems if s in profile_data["notebooks"]]
    absent = [s for s in all_stems if s not in profile_data["notebooks"]]
    for stem in list(status):
        if stem not in stems:
            del status[stem]
    _remove_stale(out_dir, absent)
    items = [_line(stem, status.get(stem) or {}, out_dir) for stem in stems]
    items += [f'<li class="absent">{html.escape(s)} &mdash; not in this profile</li>' for s in absent]
    versions = ", ".join(f"{k} {v}" for k, v in package_versions(REPORT_PACKAGES).items())
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    extends = profile_data.get("extends")
    based = f" (extends <code>{html.escape(extends)}</code>)" if extends else ""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>FP8 KV-cache study: {html.escape(profile)}</title>
<style>{STYLE}</style></head><body>
<h1>Should the KV cache be FP8? Study reports, profile <code>{html.escape(profile)}</code>{based}</h1>
<p>{html.escape(name_sources(str(profile_data.get("description") or "")))}</p>
{_card(profile, stems, status)}
<h2>Reports</h2>
<ol>
{chr(10).join(items)}
</ol>
<p class="meta">Index written {stamp} from commit {html.escape(git_commit())} on {html.escape(cpu_model())};
{html.escape(versions)}. Each report states when it was rendered.</p>
</body></html>
"""
    path = out_dir / "index.html"
    write_scrubbed(path, page, secrets)
    return path
