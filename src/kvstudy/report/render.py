"""Run a profile's notebooks with papermill, render HTML, and write the index.

``kvstudy render --profile NAME [--only NOTEBOOK ...]`` (what ``make all`` runs) checks the profile
strictly, then executes each notebook it names into a staging folder under
``reports/.staging/<profile>/``, renders it to HTML (prose, tables, figures and a settings table;
code stays in the executed notebook) and moves the finished files into ``reports/<profile>/``. A
notebook that fails keeps its last good report; its partial render is ``<notebook>.failed.html`` and
the index says it failed. One run per profile at a time. Lines a notebook prints with
``[progress]`` are shown while it runs.

A render killed part way heals on the next one: that one removes the staging folders left behind
and rebuilds ``status.json`` and the index from the reports on disk
(``report.html.status_from_reports``). Every file it writes is scrubbed of secrets by shape and of
the profile's secret values (``redact.scrub_report``).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import REPO_ROOT, read_json, read_text_checked, without_machine_paths, write_text_atomic
from kvstudy.profiles import given_parameters, load_profile, validate_profile
from kvstudy.redact import REDACTED, redact, scrub_report, scrub_tree, write_json_scrubbed, write_scrubbed
from kvstudy.report.decision import read_status
from kvstudy.report.html import render_html, status_from_reports, write_index
from kvstudy.report.notebook import GIVEN_ENV, utc_stamp

STATUS_FILE = "status.json"
# Where a render stages a notebook's files before moving them into reports/<profile>/: one folder
# per profile, so the next render of that profile removes what a killed one left there.
STAGING_DIR = ".staging"
# Output data that is not text: never scrubbed (a base64 image can hold a token-shaped run of letters).
BINARY_OUTPUTS = frozenset({"image/png", "image/jpeg", "image/gif"})
PROGRESS_PREFIX = "[progress]"
PROGRESS_ENGINE = "kvstudy-progress"
# The kernel's own log, off the terminal: its TCP-without-encryption warning is noise on a local run,
# and on Ctrl-C the kernel logs a ZMQ traceback when its reply socket closes under a cell's cleanup
# (the render says "interrupted" in one line; a cell's own errors reach the report, not this log).
KERNEL_QUIET = ["--IPKernelApp.log_level=CRITICAL"]


@dataclass
class NotebookRun:
    """One executed notebook of a profile run (its finding and verdicts: ``status.json``)."""

    name: str
    seconds: float
    error: str | None
    needs: str | None = None  # the command that provides what a live step lacked (MissingPrerequisite)


class ProgressStream:
    """A file-like sink for a kernel's stdout that forwards ``[progress]`` lines to the terminal, and
    says which cell is running (with the time so far) when a cell runs longer than ``every_s``."""

    def __init__(self, label: str, out: TextIO | None = None, every_s: float = 15.0) -> None:
        self.label, self.out, self.pending, self.every_s = label, out or sys.stdout, "", every_s
        self.started, self.lock, self.stop_event = time.perf_counter(), threading.Lock(), threading.Event()
        self.cell: tuple[int, int, str, float] | None = None  # (number, total, first line, started)
        self.ticker: threading.Thread | None = None

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                if line.startswith(PROGRESS_PREFIX):
                    self.out.write(f"{self.label} {line[len(PROGRESS_PREFIX) :].strip()}\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def cell_started(self, number: int, total: int, source: str) -> None:
        """Note the code cell now running (called by :class:`ProgressEngine`); start the ticker once."""
        first = next((ln.strip() for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        with self.lock:
            self.cell = (number, total, first[:70], time.perf_counter())
        if self.ticker is None and self.every_s > 0:
            self.ticker = threading.Thread(target=self._tick, name="kvstudy-progress", daemon=True)
            self.ticker.start()

    def _tick(self) -> None:
        while not self.stop_event.wait(self.every_s):
            with self.lock:
                if self.cell is None:
                    continue
                number, total, first, since = self.cell
                now = time.perf_counter()
                if now - since >= self.every_s:
                    self.out.write(
                        f"{self.label} notebook cell {number}/{total} running for {now - since:.0f} s "
                        f"({now - self.started:.0f} s in this notebook): {first}\n"
                    )
                    self.out.flush()

    def close(self) -> None:
        self.stop_event.set()
        if self.ticker is not None:
            self.ticker.join(timeout=1)


@functools.cache
def _progress_engine() -> str:
    """Register (once) papermill's nbclient engine that tells a :class:`ProgressStream` each cell's start."""
    from papermill.engines import NBClientEngine, papermill_engines  # here: the CLI's parser imports this module

    class ProgressEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            stream: ProgressStream = kwargs["stdout_file"]  # run_notebook's, the one caller of this engine
            original = nb_man.cell_start
            code = [i for i, c in enumerate(nb_man.nb.cells) if c.cell_type == "code"]

            def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                if cell_index in code:
                    stream.cell_started(code.index(cell_index) + 1, len(code), str(cell.source))
                return original(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register(PROGRESS_ENGINE, ProgressEngine)
    return PROGRESS_ENGINE


def run_notebook(
    source: Path,
    out_dir: Path,
    parameters: dict[str, Any],
    cwd: Path,
    given: Sequence[str] = (),
    label: str | None = None,
) -> NotebookRun:
    """Execute ``source`` into ``out_dir`` and render its HTML there (also after a failure)."""
    import papermill as pm  # here, not at module level: importing papermill costs the CLI's start about 3 s

    # jupyter's kernel chatter (the TCP-without-encryption warning, a dead kernel's "Kernel died while
    # waiting for execute reply") stays off the terminal: what a notebook run ends with is its status
    for name in ("papermill", "traitlets", "jupyter_client", "nbclient"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / source.name
    start = time.perf_counter()
    error: str | None = None
    needs: str | None = None
    stream = ProgressStream(label or f"  {source.stem}:")
    try:
        # the kernel learns from its environment which parameters the profile gave
        with mock.patch.dict(os.environ, {GIVEN_ENV: json.dumps(sorted(given))}), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm.execute_notebook(
                str(source),
                str(executed),
                parameters=parameters,
                cwd=str(cwd),
                kernel_name="python3",
                progress_bar=False,
                log_output=False,
                stdout_file=stream,
                extra_arguments=KERNEL_QUIET,
                engine_name=_progress_engine(),
            )
    except pm.PapermillExecutionError as exc:  # the partly executed notebook is kept: render it
        evalue = without_machine_paths(" ".join(str(exc.evalue).split()))
        if exc.ename == MissingPrerequisite.__name__:
            error = f"needs what this machine lacks: {evalue}"[:500]
            found_command = re.search(r"run `([^`]+)`$", evalue)
            needs = found_command.group(1) if found_command else None
        else:
            error = f"cell {exc.exec_count}: {exc.ename}: {evalue}"[:500]
    except KeyboardInterrupt:  # Ctrl-C: the CLI says it in one line; the kernel task left pending is
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # no "Task exception was never retrieved" at exit
        raise
    except Exception as exc:  # a kernel that died, a notebook that cannot be read
        error = without_machine_paths(f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:500]
    finally:
        stream.close()
    seconds = time.perf_counter() - start
    if executed.exists():
        scrub_executed(executed, parameters, cwd)
        figures = parameters["figures_dir"]  # relative to cwd: the settings table's CSV goes beside the figures
        csv = (cwd / figures, f"{source.stem[:2]}-settings", f"{figures}/")
        render_html(executed, out_dir / f"{source.stem}.html", redact(parameters), set(given), csv)
    return NotebookRun(source.stem, seconds, error, needs)


@contextmanager
def profile_lock(reports_dir: Path, profile: str) -> Iterator[None]:
    """Hold ``reports/.<profile>.lock``; a second run of the same profile is refused with a message."""
    reports_dir.mkdir(parents=True, exist_ok=True)
    path = reports_dir / f".{profile}.lock"
    try:  # never through a link: a planted one would have the pid written into the file it names
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise StudyError(
            f"{path}: cannot be used as the render's lock ({'a symbolic link' if path.is_symlink() else exc.strerror}); "
            f"expected a plain file: remove it and run again"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StudyError(f"{path}: not a plain file; expected the render's lock file: remove it and run again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise StudyError(
                f"profile {profile!r} is being rendered by {holder} (lock {path}); wait for it to finish, then run again"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _read_status(out_dir: Path, profile: str) -> dict[str, Any]:
    """The last render's status entries; a torn or tampered ``status.json`` is said in one line and
    rebuilt from the reports on disk (``status_from_reports``), never silently."""
    path = out_dir / STATUS_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        return read_status(path)
    except StudyError as exc:
        print(
            f"[{profile}] {without_machine_paths(str(exc))[:300]}; rebuilding it from the reports on disk", flush=True
        )
        return {}


def _publish(run: NotebookRun, stage: Path, out_dir: Path) -> dict[str, Any]:
    """Move one notebook's files from the staging folder into the report folder; what its status entry
    keeps of the run (``status_from_reports`` adds what the published files say)."""
    suffix = ".failed" if run.error else ""
    for ext in (".html", ".ipynb"):
        staged = stage / f"{run.name}{ext}"
        if staged.exists():
            os.replace(staged, out_dir / f"{run.name}{suffix}{ext}")
        if not run.error:
            (out_dir / f"{run.name}.failed{ext}").unlink(missing_ok=True)
    return {"seconds": round(run.seconds, 1), "rendered": utc_stamp(), "error": run.error, "needs": run.needs}


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

    def walk(original: Any, hidden: Any) -> Iterator[str]:
        if isinstance(original, str) and original != hidden and len(original) >= 4:
            yield original
        elif isinstance(original, dict):
            for key, value in original.items():
                yield from walk(value, hidden.get(key) if isinstance(hidden, dict) else REDACTED)
        elif isinstance(original, (list, tuple)):
            same = isinstance(hidden, (list, tuple)) and len(hidden) == len(original)
            for i, value in enumerate(original):
                yield from walk(value, hidden[i] if same else REDACTED)

    return sorted(set(walk(parameters, redact(parameters))), key=len, reverse=True)


def scrub_executed(executed: Path, parameters: dict[str, Any], root: Path = REPO_ROOT) -> None:
    """Rewrite an executed notebook so no secret survives: every text, sources and outputs, scrubbed
    of the injected parameters' secret values and of every secret shape (``redact.scrub``: a token
    inside a folder name, a URL password), and no folder of the rendering machine either
    (``io.without_machine_paths``: the repository's, and ``root``, the folder the render ran in)."""
    values = secret_parameter_values(parameters)
    nb = scrub_tree(read_json(executed), values, BINARY_OUTPUTS)
    text = without_machine_paths(without_machine_paths(json.dumps(nb, indent=1, ensure_ascii=False), root))
    for value in values:  # as JSON spells it inside a string, and as it is
        text = text.replace(json.dumps(value, ensure_ascii=False)[1:-1], REDACTED).replace(value, REDACTED)
    write_text_atomic(executed, text + "\n")


def scrub_figure_tables(figures_dir: Path, values: list[str]) -> None:
    """Rewrite the CSV files a notebook left in ``figures_dir`` scrubbed of the profile's secret
    values (``io.write_csv`` already hid every secret shape as the kernel wrote them)."""
    if figures_dir.is_dir():
        for path in figures_dir.glob("*.csv"):
            if path.is_file() and not path.is_symlink():
                text = read_text_checked(path, errors="replace")
                if scrub_report(text, values) != text:
                    write_scrubbed(path, text, values)


def run_profile(profile: str, root: Path = REPO_ROOT, only: Sequence[str] = ()) -> list[NotebookRun]:
    """Check the profile, run its notebooks (or ``only`` these), publish them and rewrite the index."""
    profile_data = load_profile(profile, root / "profiles")
    declared = validate_profile(profile_data, root / "notebooks")
    selected = check_only(only, profile_data, profile) if only else list(profile_data["notebooks"])
    reports_dir, figures_dir = root / "reports", Path("figures") / profile
    out_dir, staging = reports_dir / profile, reports_dir / STAGING_DIR / profile
    runs, began = [], time.perf_counter()
    given_by = {stem: given_parameters(profile_data, stem, declared[stem]) for stem in profile_data["notebooks"]}
    secrets = secret_parameter_values(list(given_by.values()))  # none reaches the index or status
    with profile_lock(reports_dir, profile):
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # what a killed render left
        status = _read_status(out_dir, profile)
        staging.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=staging))
        try:
            for number, stem in enumerate(sorted(selected), 1):
                given = given_by[stem]
                params = {**given, "profile": profile, "figures_dir": str(figures_dir)}
                so_far = f", {time.perf_counter() - began:.0f} s so far" if number > 1 else ""
                print(f"[{profile}] ({number}/{len(selected)}) running {stem}{so_far} ...", flush=True)
                notebook = root / "notebooks" / f"{stem}.ipynb"
                run = run_notebook(notebook, stage, params, root, sorted(given), f"[{profile}]   {stem}:")
                scrub_figure_tables(root / figures_dir, secrets)
                state = f"FAILED ({run.error})" if run.error else "ok"
                print(f"[{profile}] {stem}: {state} in {run.seconds:.1f} s", flush=True)
                status[stem] = _publish(run, stage, out_dir)
                runs.append(run)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        all_stems = sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
        # the index says what the reports on disk say, so one a killed render left stale heals here
        status = status_from_reports(out_dir, [s for s in all_stems if s in profile_data["notebooks"]], status)
        # entries redacted by field name inside (a stem such as 01_secrets is no secret's name)
        status = scrub_tree({stem: redact(entry) for stem, entry in status.items()}, secrets)
        index = write_index(out_dir, profile, profile_data, all_stems, status, secrets)
        write_json_scrubbed(out_dir / STATUS_FILE, status, secrets)
    print(f"[{profile}] index: {index.relative_to(root)}")
    return runs


def report_failures(runs: Sequence[NotebookRun]) -> int:
    """One line on stderr per notebook that did not render (and what to run, where known); the exit code."""
    failed = [r for r in runs if r.error]
    for run in failed:
        what = run.error if run.needs else f"failed: {run.error}"
        print(f"kvstudy: error: notebooks/{run.name}.ipynb {what}", file=sys.stderr)
    return 1 if failed else 0
