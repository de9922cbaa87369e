"""Run a profile's notebooks with papermill, render HTML, and write the index.

``kvstudy render --profile NAME [--only NOTEBOOK ...]`` (what ``make all`` runs) checks the profile
strictly, then executes each notebook it names into a temporary folder under ``reports/``, renders
it to HTML (prose, tables, figures and a settings table; code stays in the executed notebook) and
moves the finished files into ``reports/<profile>/``. A notebook that fails keeps its last good
report; its partial render is ``<notebook>.failed.html`` and the index says it failed. One run per
profile at a time. Lines a notebook prints with ``[progress]`` are shown while it runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kvstudy.errors import StudyError
from kvstudy.io import write_text_atomic
from kvstudy.notebook import GIVEN_ENV, REPO_ROOT
from kvstudy.profiles import (
    Parameter,
    check_profile_name,
    given_parameters,
    load_profile,
    validate_profile,
)
from kvstudy.redact import REDACTED, redact, scrub
from kvstudy.report_html import extract_results, render_html
from kvstudy.report_index import write_index

STATUS_FILE = "status.json"
PROGRESS_PREFIX = "[progress]"
# The kernel's own log: errors only (its TCP-without-encryption warning is noise on a local run).
KERNEL_QUIET = ["--IPKernelApp.log_level=ERROR"]


@dataclass
class NotebookRun:
    """One executed notebook of a profile run."""

    name: str
    html_path: Path
    seconds: float
    finding: str | None
    error: str | None
    verdicts: list[dict[str, str]] = field(default_factory=list)


class ProgressStream:
    """A file-like sink for a kernel's stdout that forwards ``[progress]`` lines to the terminal."""

    def __init__(self, label: str, out: TextIO | None = None) -> None:
        self.label, self.out, self.pending = label, out or sys.stdout, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.startswith(PROGRESS_PREFIX):
                self.out.write(f"{self.label} {line[len(PROGRESS_PREFIX) :].strip()}\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()


@contextmanager
def _given_in_environment(given: Sequence[str]) -> Iterator[None]:
    """Tell the kernel (through its environment) which parameters the profile gave."""
    old = os.environ.get(GIVEN_ENV)
    os.environ[GIVEN_ENV] = json.dumps(sorted(given))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(GIVEN_ENV, None)
        else:
            os.environ[GIVEN_ENV] = old


def _quiet_kernel_logs() -> None:
    """Keep jupyter's kernel chatter (the TCP-without-encryption warning and the like) off the terminal."""
    import logging

    for name in ("papermill", "traitlets", "jupyter_client", "nbclient"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_notebook(
    source: Path,
    out_dir: Path,
    parameters: dict[str, Any],
    cwd: Path,
    given: Sequence[str] = (),
    label: str | None = None,
) -> NotebookRun:
    """Execute ``source`` into ``out_dir`` and render its HTML there (also after a failure)."""
    import warnings

    import papermill as pm

    _quiet_kernel_logs()
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / source.name
    html_path = out_dir / f"{source.stem}.html"
    start = time.perf_counter()
    error = None
    try:
        with _given_in_environment(given), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm.execute_notebook(
                str(source),
                str(executed),
                parameters=parameters,
                cwd=str(cwd),
                kernel_name="python3",
                progress_bar=False,
                log_output=False,
                stdout_file=ProgressStream(label or f"  {source.stem}:"),
                extra_arguments=KERNEL_QUIET,
            )
    except pm.PapermillExecutionError as exc:  # the partly executed notebook is kept: render it
        error = f"cell {exc.exec_count}: {exc.ename}: {' '.join(str(exc.evalue).split())}"[:500]
    except Exception as exc:  # a kernel that died, a notebook that cannot be read
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
    seconds = time.perf_counter() - start
    found: str | None = None
    verdicts: list[Any] = []
    if executed.exists():
        scrub_executed(executed, parameters)
        render_html(executed, html_path, redact(parameters), set(given))
        found, verdicts = extract_results(executed)
    return NotebookRun(source.stem, html_path, seconds, found, error, verdicts)


@contextmanager
def profile_lock(reports_dir: Path, profile: str) -> Iterator[None]:
    """Hold ``reports/.<profile>.lock``; a second run of the same profile is refused with a message."""
    reports_dir.mkdir(parents=True, exist_ok=True)
    path = reports_dir / f".{profile}.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StudyError(
                f"profile {profile!r} is being rendered by {holder} (lock {path}); "
                f"wait for it to finish, then run again"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_status(out_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((out_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _publish(run: NotebookRun, stage: Path, out_dir: Path) -> dict[str, Any]:
    """Move one notebook's files from the staging folder into the report folder; its status entry."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    entry: dict[str, Any] = {"seconds": round(run.seconds, 1), "rendered": stamp}
    suffix = ".failed" if run.error else ""
    for ext in (".html", ".ipynb"):
        staged = stage / f"{run.name}{ext}"
        if staged.exists():
            os.replace(staged, out_dir / f"{run.name}{suffix}{ext}")
    if run.error:
        entry.update(error=run.error, failed_html=f"{run.name}.failed.html")
    else:
        for ext in (".html", ".ipynb"):
            (out_dir / f"{run.name}.failed{ext}").unlink(missing_ok=True)
        entry.update(error=None, finding=run.finding, verdicts=run.verdicts)
    return entry


def check_only(only: Sequence[str], profile_data: dict[str, Any], profile: str) -> list[str]:
    """Notebook stems from ``--only`` (``.ipynb`` allowed); each must be a notebook of the profile."""
    names = [Path(name).name.removesuffix(".ipynb") for name in only]
    for name in names:
        if name not in profile_data["notebooks"]:
            raise StudyError(
                f"{profile_data['path']}: --only {name!r} is not a notebook of profile "
                f"{profile!r} (its notebooks: {', '.join(profile_data['notebooks'])})"
            )
    return names


def secret_parameter_values(parameters: Any) -> list[str]:
    """The string values ``redact`` would hide in ``parameters`` (by name or by shape), longest first;
    a ``{from_env: NAME}`` reference holds none."""
    found: set[str] = set()

    def walk(original: Any, hidden: Any) -> None:
        if isinstance(original, str):
            if original != hidden and len(original) >= 4:
                found.add(original)
        elif isinstance(original, dict):
            for key, value in original.items():
                walk(value, hidden.get(key) if isinstance(hidden, dict) else REDACTED)
        elif isinstance(original, (list, tuple)):
            same = isinstance(hidden, (list, tuple)) and len(hidden) == len(original)
            for i, value in enumerate(original):
                walk(value, hidden[i] if same else REDACTED)

    walk(parameters, redact(parameters))
    return sorted(found, key=len, reverse=True)


def scrub_executed(executed: Path, parameters: dict[str, Any]) -> None:
    """Rewrite an executed notebook so no secret of its injected parameters survives: the injected
    cell redacted by name and value, every other text (sources, outputs) by value."""
    values = secret_parameter_values(parameters)
    nb = json.loads(executed.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if "injected-parameters" in ((cell.get("metadata") or {}).get("tags") or []):
            source = cell.get("source", "")
            cell["source"] = scrub("".join(source) if isinstance(source, list) else str(source), values)
    text = json.dumps(nb, indent=1, ensure_ascii=False)
    for value in values:  # as JSON spells it inside a string, and as it is
        text = text.replace(json.dumps(value, ensure_ascii=False)[1:-1], REDACTED).replace(value, REDACTED)
    write_text_atomic(executed, text + "\n")


def run_profile(profile: str, root: Path = REPO_ROOT, only: Sequence[str] = ()) -> list[NotebookRun]:
    """Check the profile, run its notebooks (or ``only`` these), publish them and rewrite the index."""
    check_profile_name(profile)
    profile_data = load_profile(profile, root / "profiles")
    declared: dict[str, dict[str, Parameter]] = validate_profile(profile_data, root / "notebooks")
    selected = check_only(only, profile_data, profile) if only else list(profile_data["notebooks"])
    reports_dir = root / "reports"
    out_dir = reports_dir / profile
    figures_dir = Path("figures") / profile
    runs = []
    with profile_lock(reports_dir, profile):
        out_dir.mkdir(parents=True, exist_ok=True)
        status = _read_status(out_dir)
        stage = Path(tempfile.mkdtemp(prefix=f".{profile}-", dir=reports_dir))
        try:
            for number, stem in enumerate(sorted(selected), 1):
                given = given_parameters(profile_data, stem, declared[stem])
                params = {**given, "profile": profile, "figures_dir": str(figures_dir)}
                print(f"[{profile}] ({number}/{len(selected)}) running {stem} ...", flush=True)
                run = run_notebook(
                    root / "notebooks" / f"{stem}.ipynb",
                    stage,
                    params,
                    root,
                    given=sorted(given),
                    label=f"[{profile}]   {stem}:",
                )
                state = f"FAILED ({run.error})" if run.error else "ok"
                print(f"[{profile}] {stem}: {state} in {run.seconds:.1f} s", flush=True)
                status[stem] = _publish(run, stage, out_dir)
                runs.append(run)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        all_stems = sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
        index = write_index(out_dir, profile, profile_data, all_stems, status)
        (out_dir / STATUS_FILE).write_text(json.dumps(status, indent=1), encoding="utf-8")
    print(f"[{profile}] index: {index.relative_to(root)}")
    return runs


def _cmd_render(args: argparse.Namespace) -> int:
    runs = run_profile(args.profile, only=args.only)
    failed = [r for r in runs if r.error]
    for run in failed:
        print(f"kvstudy: error: notebooks/{run.name}.ipynb failed: {run.error}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy render``."""
    parser = subparsers.add_parser(
        "render",
        help="run a profile's notebooks and render the HTML reports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", default="reference", help="a file in profiles/ without .yaml")
    parser.add_argument(
        "--only",
        nargs="*",
        default=(),
        help="run only these notebooks of the profile (the index keeps the others' last reports)",
    )
    parser.set_defaults(func=_cmd_render)
