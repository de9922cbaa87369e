"""The one table layer: every report table is a :class:`Table` of :class:`Column` specs over typed records.

A column names the record field it shows (``key``), its header, its unit and how its cells are
formatted; :func:`render` makes the DataFrame a notebook displays (and writes as CSV). The experiments
hand notebooks records (dataclasses), never frames keyed by prose headers; a notebook reads the
records' fields for its own conclusions, never a rendered cell. The accuracy tables are in
:mod:`kvstudy.report.accuracy`; the speed and context tables are here.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvstudy.formats import per_token_interval, significant
from kvstudy.speed.verdicts_table import (
    NO_CLAIM_AGAINST_BOUND,
    CaptureVerdict,
    beyond_bound,
    change_text,
    fmt,
)

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Column:
    """One column of a table: which field of the record it shows, under which header, how."""

    key: str  # attribute path on the record, e.g. "comparison.counts.baseline_only"; "" = the record
    header: str  # "{unit}" and "{row.<path>}" (a field of the first record) are filled in
    unit: str = ""  # "%", "points", "items", "tokens"; "" for labels, counts and p-values
    format: Callable[[Any], Any] = lambda value: value  # the field's value -> the cell (number, text, bool or None)

    def title(self, first: Any) -> str:
        return self.header.format(unit=self.unit, row=first)

    def cell(self, record: Any) -> Any:
        return self.format(operator.attrgetter(self.key)(record) if self.key else record)


@dataclass(frozen=True)
class Table:
    """The column specs of one table, in order."""

    columns: tuple[Column, ...]

    def without(self, *headers: str) -> Table:
        """The same table without the columns with these headers (as written in the spec)."""
        return replace(self, columns=tuple(c for c in self.columns if c.header not in headers))

    def only(self, *headers: str) -> Table:
        """The same table with only the columns with these headers (as written in the spec), in its order."""
        return replace(self, columns=tuple(c for c in self.columns if c.header in headers))


def render(records: Sequence[Any], table: Table) -> pd.DataFrame:
    """The records as a DataFrame for :func:`kvstudy.report.notebook.table` (empty without records)."""
    import pandas as pd

    if not records:
        return pd.DataFrame()
    titles = [c.title(records[0]) for c in table.columns]
    return pd.DataFrame([{t: c.cell(r) for t, c in zip(titles, table.columns)} for r in records])


def or_text(text: str) -> Callable[[Any], Any]:
    """The value itself, or ``text`` where it is None (not judged, not defined)."""
    return lambda value: text if value is None else value


def _pair(spec: str, scale: float = 1.0, sep: str = " / ") -> Callable[[tuple[float, float]], str]:
    return lambda ab: f"{ab[0] / scale:{spec}}{sep}{ab[1] / scale:{spec}}"


# --------------------------------------------------------------------------- notebook 02 (speed)


def _bound(cv: CaptureVerdict) -> str:
    if cv.bound_pct is not None:
        return f"{cv.bound_pct:.2f}"
    return "n/a (same dtype)" if cv.bound_note.startswith("same") else "not computed"


def _against_bound(cv: CaptureVerdict) -> str:
    v = cv.verdict
    if cv.bound_pct is None:
        return ""
    return (
        NO_CLAIM_AGAINST_BOUND if v.verdict == "no claim" else beyond_bound(v.tpot_ratio, v.tpot_ratio_ci, cv.bound_pct)
    )


SPEED_VERDICTS = Table(
    (
        Column("users", "users"),
        Column("", "baseline → candidate", format=lambda cv: f"{cv.baseline} → {cv.candidate}"),
        Column("effect", "effect"),
        Column("verdict.runs", "runs", format=lambda n: f"{n['baseline']} / {n['candidate']}"),
        Column("verdict.tpot_ratio", "TPOT ratio (cand/base)", format=lambda r: fmt(r, ".3f")),
        Column("verdict.tpot_ratio", "change", format=change_text),
        Column(
            "verdict.tpot_ratio_ci",
            "95 % interval",
            format=lambda ci: "" if ci is None else _pair(".3f", sep=" to ")(ci),
        ),
        Column("verdict.p_value", "p", format=lambda p: fmt(p, ".3g")),
        Column("verdict.min_p_value", "min reachable p", format=lambda p: fmt(p, ".3g")),
        Column("verdict.p_adjusted", "p, Holm over {row.verdict.family_size} tests", format=lambda p: fmt(p, ".3g")),
        Column("verdict.blocks", "seed blocks", format=lambda b: b or "none (unblocked)"),
        Column("verdict.registered_runs_per_arm", "registered runs per arm", format=or_text("")),
        Column(
            "verdict",
            "measurable",
            format=lambda v: "yes" if v.measurable else "no: " + "; ".join(r for r in v.reasons if "not measured" in r),
        ),
        Column(
            "verdict",
            "clock ratio (cand/base)",
            format=lambda v: fmt(v.clock_ratio, ".3f") if v.clock_status == "compared" else v.clock_status,
        ),
        Column(
            "verdict.cycles_per_token",
            "cycles/token base, cand (M)",
            format=lambda c: _pair(".3g", 1e6, ", ")((c["baseline"], c["candidate"])) if c else "",
        ),
        Column("verdict.clock_adjusted_ratio", "cycles ratio (cand/base)", format=lambda r: fmt(r, ".3f")),
        Column("verdict.order_design", "run order"),
        Column("", "roofline bound (% less time)", format=_bound),
        Column("", "against the bound", format=_against_bound),
        Column("verdict.verdict", "verdict"),
        Column(
            "verdict.reasons",
            "why",
            format=lambda rs: "; ".join(r for r in rs if not r.startswith(("TPOT ratio", "cycles per token"))),
        ),
    )
)
_KEY = ("users", "baseline → candidate")
# the verdicts, then the design and clock behind them (two tables that fit the page; the CSV keeps all)
SPEED_VERDICT_MAIN = SPEED_VERDICTS.only(
    *_KEY, "effect", "change", "95 % interval", "p", "p, Holm over {row.verdict.family_size} tests", "verdict"
)
SPEED_VERDICT_DESIGN = SPEED_VERDICTS.without(
    *(c.header for c in SPEED_VERDICT_MAIN.columns if c.header not in _KEY), "why"
)

PUBLISHED_VERDICTS = Table(
    (
        Column("users", "users"),
        Column("tpot_ms", "TPOT base / cand (ms, published)", format=_pair("g")),
        Column("seeds", "seeds", format=lambda n: f"{n[0]} / {n[1]}"),
        Column("tpot_ratio", "TPOT ratio (cand/base)", format=lambda r: f"{r:.3f}"),
        Column("tpot_ratio", "change", format=change_text),
        Column("min_p_value", "min reachable p", format=lambda p: f"{p:.2g}"),
        Column("clock_ratio", "clock ratio (cand/base)", format=lambda r: f"{r:.3f}"),
        Column("cycles_per_token", "cycles/token base, cand (M)", format=_pair(".1f", 1e6, ", ")),
        Column(
            "cycles_per_token",
            "cycles per token (cand/base)",
            format=lambda c: change_text(c[1] / c[0]).replace("faster by", "fewer by").replace("slower by", "more by"),
        ),
        Column(
            "bound_pct",
            "roofline bound (% less time, {row.context_len} tokens assumed)",
            format=lambda b: "not computed (no config.json)" if b is None else f"{b:.2f}",
        ),
        Column(
            "",
            "against the bound",
            format=lambda r: (
                ""
                if r.bound_pct is None
                else f"no claim: {r.contradicted}; and the smallest reachable p is {r.min_p_value:.2g}"
                if r.contradicted
                else f"{NO_CLAIM_AGAINST_BOUND} (smallest reachable p {r.min_p_value:.2g})"
            ),
        ),
        Column("verdict", "verdict (new rule)"),
        Column("reasons", "why", format="; ".join),
    )
)

PUBLISHED_CONSISTENCY = Table(
    (
        Column("users", "users"),
        Column("configuration", "configuration"),
        Column("output_tok_s", "output tok/s (published)"),
        Column("median_tpot_ms", "median TPOT ms (published)"),
        Column("implied_streams", "streams implied (tok/s x TPOT)"),
        Column("requests_that_fit", "requests of {row.context_len:,} tokens that fit"),
        Column("check", "check"),
    )
)


ADMISSION = Table(
    (
        Column("users", "users"),
        Column("context_len", "tokens per request"),
        Column("blocks_per_request", "blocks per request"),
        Column("block_size", "block size"),
        Column("blocks_needed", "blocks needed by all users"),
        Column("pool_blocks", "pool blocks"),
        Column("requests_that_fit", "requests that fit at once"),
        Column("", "queueing", format=lambda a: f"yes: {a.waiting} of {a.users} requests wait" if a.waiting else "no"),
        Column("origin", "origin"),
    )
)

# --------------------------------------------------------------------------- notebook 05 (context)

ROOFLINE_VS_PUBLISHED = Table(
    (
        Column("figure", "figure"),
        Column("quantity", "quantity"),
        Column("published", "published"),
        Column("published_origin", "published origin"),
        Column("roofline", "roofline"),
        Column("basis", "roofline basis"),
        Column("gap", "published / roofline"),
        Column("assumed", "assumed"),
    )
)


def slope_interval(ci: tuple[float, float] | None) -> str:
    """A measured slope's 95 % interval in per-token time ("" without a fit)."""
    return "" if ci is None else per_token_interval(*ci)


def ratio_interval(row: Any) -> str:
    """The 95 % interval of measured / predicted slope ("" without a fit)."""
    if row.slope_ci is None:
        return ""
    lo, hi = row.slope_ci
    return f"{significant(lo / row.predicted_ms, 2)} .. {significant(hi / row.predicted_ms, 2)}"


SLOPES = Table(
    (
        Column("arm", "arm"),
        Column("kv_dtype", "kv dtype"),
        Column("slope_ms", "measured slope (ms/token)"),
        Column("slope_ci", "95 % interval", format=slope_interval),
        Column("resolved", "resolved"),
        Column("predicted_ms", "predicted slope (ms/token)"),
        Column("bandwidth_gb_s", "bandwidth ({row.bandwidth_origin})"),
        Column("ratio", "measured / predicted"),
        Column("", "measured / predicted, 95 %", format=ratio_interval),
        Column("kv_longest_mib", "KV at the longest length (MiB)"),
        Column("roofline_applies", "roofline applies"),
        Column("status", "status"),
    )
)

ARM_COMPARISONS = Table(
    (
        Column("baseline", "baseline"),
        Column("candidate", "candidate"),
        Column("slope_ratio", "slope ratio"),
        Column("slope_ratio_ci", "ratio 95 % interval"),
        Column("break_even_tokens", "break-even (tokens)"),
        Column("break_even_ci", "break-even 95 % interval"),
        Column("statement", "statement"),
    )
)

DOCS_VS_ROOFLINE = Table(
    (
        Column("context", "context"),
        Column("tokens", "tokens"),
        Column("published_pct", "FP8 tok/s change (%), published"),
        Column("roofline_pct", "roofline gain (%), {row.users} user(s) assumed", format=lambda x: round(x, 2)),
        Column("gap", "published / roofline"),
        Column("origin", "origin"),
    )
)
