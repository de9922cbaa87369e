"""The index page of a profile's reports: a verdict card, one line per notebook, what is not in it."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.io import write_text_atomic
from kvstudy.machine import REPORT_PACKAGES, cpu_model, package_versions
from kvstudy.notebook import git_commit
from kvstudy.report_html import name_sources

STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.5}
li{margin:.6em 0}.meta{color:#555;font-size:.9em}.failed{color:#a00}.absent{color:#777}
.card{border:1px solid #ccc;border-radius:6px;padding:.6em 1.2em;background:#f8f8f8}
.card dt{font-weight:bold;margin-top:.5em}.card dd{margin-left:1em}"""


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _card(stems: Sequence[str], status: dict[str, Any]) -> str:
    """The verdict card: each notebook's structured verdicts, or its finding, with a link."""
    rows = []
    for stem in stems:
        entry = status.get(stem) or {}
        if entry.get("error") or not entry:
            rows.append(f'<dt>{html.escape(stem)}</dt><dd class="failed">{_no_verdict(entry)}</dd>')
            continue
        verdicts = entry.get("verdicts") or (
            [{"topic": stem, "text": entry["finding"]}] if entry.get("finding") else []
        )
        for item in verdicts:
            rows.append(
                f"<dt>{html.escape(item['topic'])}</dt><dd>{html.escape(name_sources(item['text']))} "
                f"({_link(stem + '.html', 'report')})</dd>"
            )
    if not rows:
        return ""
    return '<h2>Verdicts</h2><dl class="card">\n' + "\n".join(rows) + "\n</dl>"


def _no_verdict(entry: dict[str, Any]) -> str:
    """Why a notebook gives no verdict, and what to run to get one (HTML)."""
    if not entry:
        return "no verdict: not rendered yet for this profile (<code>make all</code>)"
    if entry.get("needs"):
        return (
            f"no verdict: {html.escape(entry['error'])}. Run <code>{html.escape(entry['needs'])}</code>, "
            "then <code>make all</code> again."
        )
    return f"no verdict: the notebook failed ({html.escape(entry['error'])}); see {_link(entry['failed_html'], 'where it stopped')}"


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
        if (out_dir / f"{stem}.html").exists():
            parts.append(_link(f"{stem}.html", "last good report") + " (older run)")
        return f"<li>{html.escape(stem)} &mdash; " + "; ".join(parts) + "</li>"
    finding = name_sources(entry.get("finding") or "(the notebook stated no finding)")
    return (
        f"<li>{_link(stem + '.html', stem)} ({_link(stem + '.ipynb', 'notebook with code')}) "
        f"&mdash; {html.escape(finding)}</li>"
    )


def _remove_stale(out_dir: Path, stems: Sequence[str]) -> None:
    """Remove reports of notebooks that are not in the profile, so none is taken for its results."""
    for stem in stems:
        for suffix in (".html", ".ipynb", ".failed.html", ".failed.ipynb"):
            (out_dir / f"{stem}{suffix}").unlink(missing_ok=True)


def write_index(
    out_dir: Path, profile: str, profile_data: dict[str, Any], all_stems: Sequence[str], status: dict[str, Any]
) -> Path:
    """Write ``index.html`` (atomically) for the profile's notebooks; drop entries of other notebooks."""
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
{_card(stems, status)}
<h2>Reports</h2>
<ol>
{chr(10).join(items)}
</ol>
<p class="meta">Index written {stamp} from commit {html.escape(git_commit())} on {html.escape(cpu_model())};
{html.escape(versions)}. Each report states when it was rendered.</p>
</body></html>
"""
    path = out_dir / "index.html"
    write_text_atomic(path, page)
    return path
