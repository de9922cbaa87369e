"""Run the study's notebooks for a profile with papermill, render HTML, and write the index.

``kvstudy render --profile NAME`` (what ``make all`` runs) executes each notebook of the profile
into ``reports/<profile>/``, renders it to HTML (prose, tables and figures; code stays in the
executed notebook) and writes ``index.html`` with each notebook's finding.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.machine import REPORT_PACKAGES, cpu_model, package_versions
from kvstudy.notebook import FINDING_KEY, REPO_ROOT, git_commit
from kvstudy.profiles import load_profile, notebook_parameters

# Code cells whose source the HTML keeps: the parameters a reader needs to re-run the report.
SHOWN_CODE_TAGS = {"parameters", "injected-parameters"}


@dataclass
class NotebookRun:
    """One executed notebook of a profile run."""

    name: str
    html_path: Path
    seconds: float
    finding: str | None
    error: str | None


def extract_finding(notebook_path: Path) -> str | None:
    nb = json.loads(notebook_path.read_text())
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            text = (output.get("metadata") or {}).get(FINDING_KEY)
            if text:
                return str(text)
    return None


def render_html(notebook_path: Path, html_path: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook_path, as_version=4)
    for cell in nb.cells:  # the report shows prose, tables and figures; code stays in the .ipynb
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code" and not tags & SHOWN_CODE_TAGS:
            cell.metadata.setdefault("transient", {})["remove_source"] = True
    body, _ = HTMLExporter(template_name="lab", exclude_input_prompt=True,
                           exclude_output_prompt=True).from_notebook_node(nb)
    html_path.write_text(body, encoding="utf-8")


def run_notebook(source: Path, out_dir: Path, parameters: dict[str, Any], cwd: Path) -> NotebookRun:
    import papermill as pm

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / source.name
    html_path = out_dir / f"{source.stem}.html"
    start = time.perf_counter()
    error = None
    try:
        pm.execute_notebook(str(source), str(executed), parameters=parameters, cwd=str(cwd),
                            kernel_name="python3", progress_bar=False, log_output=False)
    except pm.PapermillExecutionError as exc:  # the partly executed notebook is kept: render it
        error = f"cell {exc.exec_count}: {exc.ename}: {' '.join(str(exc.evalue).split())}"[:500]
    except Exception as exc:  # a kernel that died, a notebook that cannot be read
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
    seconds = time.perf_counter() - start
    found = None
    if executed.exists():
        render_html(executed, html_path)
        found = extract_finding(executed)
    return NotebookRun(source.stem, html_path, seconds, found, error)


def write_index(runs: Sequence[NotebookRun], profile: str, profile_data: dict[str, Any],
                out_dir: Path) -> Path:
    items = []
    for run in runs:
        if run.error:
            summary = f"<strong>failed:</strong> {html.escape(run.error)}"
        else:
            summary = html.escape(run.finding or "(the notebook stated no finding)")
        items.append(f'<li><a href="{html.escape(run.html_path.name)}">{html.escape(run.name)}</a>'
                     f' (<a href="{html.escape(run.name)}.ipynb">notebook with code</a>) &mdash; {summary}</li>')
    versions = ", ".join(f"{k} {v}" for k, v in package_versions(REPORT_PACKAGES).items())
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>FP8 KV-cache study: {html.escape(profile)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.5}}li{{margin:.6em 0}}
.meta{{color:#555;font-size:.9em}}</style></head><body>
<h1>Should the KV cache be FP8? Study reports, profile <code>{html.escape(profile)}</code></h1>
<p>{html.escape(str(profile_data.get("description", "")))}</p>
<ol>
{chr(10).join(items)}
</ol>
<p class="meta">Rendered {stamp} from commit {html.escape(git_commit())} on {html.escape(cpu_model())};
{html.escape(versions)}.</p>
</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def run_profile(profile: str, root: Path = REPO_ROOT, only: Sequence[str] = ()) -> list[NotebookRun]:
    profile_data = load_profile(profile, root / "profiles")
    all_notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    notebooks = [nb for nb in all_notebooks if not only or nb.stem in only or nb.name in only]
    unknown = set(profile_data.get("notebooks") or {}) - {nb.stem for nb in all_notebooks}
    if unknown:
        raise StudyError(f"profiles/{profile}.yaml: 'notebooks' names {sorted(unknown)}, which are not in notebooks/")
    out_dir = root / "reports" / profile
    figures_dir = Path("figures") / profile
    runs = []
    for source in notebooks:
        params = notebook_parameters(profile_data, source.stem, profile, figures_dir)
        print(f"[{profile}] running {source.name} ...", flush=True)
        run = run_notebook(source, out_dir, params, root)
        status = "FAILED" if run.error else "ok"
        print(f"[{profile}] {source.name}: {status} in {run.seconds:.1f} s", flush=True)
        runs.append(run)
    if not only:
        index = write_index(runs, profile, profile_data, out_dir)
        print(f"[{profile}] index: {index.relative_to(root)}")
    return runs


def _cmd_render(args: argparse.Namespace) -> int:
    runs = run_profile(args.profile, only=args.only)
    failed = [r for r in runs if r.error]
    for run in failed:
        print(f"kvstudy: error: notebooks/{run.name}.ipynb failed: {run.error}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("render", help="run a profile's notebooks and render the HTML reports",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="reference", help="a file in profiles/ without .yaml")
    parser.add_argument("--only", nargs="*", default=(), help="run only these notebooks (no index)")
    parser.set_defaults(func=_cmd_render)
