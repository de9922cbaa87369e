"""What every notebook imports: its headline finding, figures, and the provenance block.

A notebook ends with ``finding("...")`` (the one line the index quotes) and shows
``provenance(data=[...], **settings)``: when, from which commit, on which machine, with which
package versions, settings and data files (with their digests) the report was made.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.io import file_digest
from kvstudy.machine import REPORT_PACKAGES, cpu_model, package_versions

FINDING_KEY = "kvstudy_finding"
REPO_ROOT = Path(__file__).resolve().parents[2]


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
