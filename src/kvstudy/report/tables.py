"""The one table layer: every report table is a ``Table``, a tuple of :class:`Column` specs, over typed records.

A column names the record field it shows (``key``), its header, its unit and how its cells are
formatted; :func:`render` makes the DataFrame a notebook displays (and writes as CSV). The experiments
hand notebooks records (dataclasses), never frames keyed by prose headers; a notebook reads the
records' fields for its own conclusions, never a rendered cell. This module is also the one place
that words the accuracy verdicts (notebooks 03 and 06): the statistics (:mod:`kvstudy.stats`) and
the records (:mod:`kvstudy.accuracy.verdicts`) carry numbers only.

Signs: a difference is candidate minus baseline, in points (hundredths), shown with its sign.
Overlapping Wilson intervals are never used as a test, and no sentence here says they are.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvstudy.accuracy.runner import ConfigResult
from kvstudy.accuracy.verdicts import RetrievalPaired
from kvstudy.capture import MANIFEST, read_manifest
from kvstudy.formats import p_text, per_token_interval, significant
from kvstudy.speed.verdicts_table import (
    NO_CLAIM_AGAINST_BOUND,
    CaptureVerdict,
    beyond_bound,
    change_text,
    fmt,
)
from kvstudy.stats.binary import ChanceCheck, DifferenceInterval, Discrimination, NonInferiority, holm
from kvstudy.stats.binary_power import TotalsBounds


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


Table = tuple[Column, ...]  # the column specs of one table, in order


def without(table: Table, *headers: str) -> Table:
    """The same table without the columns with these headers (as written in the spec)."""
    return tuple(c for c in table if c.header not in headers)


def only(table: Table, *headers: str) -> Table:
    """The same table with only the columns with these headers (as written in the spec), in its order."""
    return tuple(c for c in table if c.header in headers)


def render(records: Sequence[Any], table: Table) -> pd.DataFrame:
    """The records as a DataFrame for :func:`kvstudy.report.notebook.table` (empty without records)."""
    if not records:
        return pd.DataFrame()
    titles = [c.title(records[0]) for c in table]
    return pd.DataFrame([{t: c.cell(r) for t, c in zip(titles, table)} for r in records])


def or_text(text: str) -> Callable[[Any], Any]:
    """The value itself, or ``text`` where it is None (not judged, not defined)."""
    return lambda value: text if value is None else value


def _pair(spec: str, scale: float = 1.0, sep: str = " / ") -> Callable[[tuple[float, float]], str]:
    return lambda ab: f"{ab[0] / scale:{spec}}{sep}{ab[1] / scale:{spec}}"


def _p(p: float | None) -> str:
    """A p-value with three significant digits, "" where missing (tables print floats at fixed decimals)."""
    return fmt(p, ".3g")


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


SPEED_VERDICTS = (
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
    Column("verdict.p_value", "p", format=_p),
    Column("verdict.min_p_value", "min reachable p", format=_p),
    Column("verdict.p_adjusted", "p, Holm over {row.verdict.family_size} tests", format=_p),
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
_KEY = ("users", "baseline → candidate")
_MAIN = ("effect", "change", "95 % interval", "p", "p, Holm over {row.verdict.family_size} tests", "verdict")
# the verdicts, then the design and clock behind them (two tables that fit the page; the CSV keeps all)
SPEED_VERDICT_MAIN = only(SPEED_VERDICTS, *_KEY, *_MAIN)
SPEED_VERDICT_DESIGN = without(SPEED_VERDICTS, *_MAIN, "why")

PUBLISHED_VERDICTS = (
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

PUBLISHED_CONSISTENCY = (
    Column("users", "users"),
    Column("configuration", "configuration"),
    Column("output_tok_s", "output tok/s (published)"),
    Column("median_tpot_ms", "median TPOT ms (published)"),
    Column("implied_streams", "streams implied (tok/s x TPOT)"),
    Column("requests_that_fit", "requests of {row.context_len:,} tokens that fit"),
    Column("check", "check"),
)


ADMISSION = (
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

# --------------------------------------------------------------------------- notebook 05 (context)

PUBLISHED_SLOPES = (  # kvstudy.context.predict.SlopeDerivation: each figure as printed and as derived
    Column("id", "id"),
    Column("figure.model", "model"),
    Column("figure.gpu", "gpu"),
    Column("figure.candidate", "candidate"),
    Column("figure.slope_baseline_ms_per_token", "slope bf16 (ms/token)"),
    Column("figure.slope_candidate_ms_per_token", "slope fp8 (ms/token)"),
    Column("figure.slope_ratio_printed_pct", "printed ratio %"),
    Column("slope_ratio_pct", "ratio %"),
    Column("slope_reduction_pct", "reduction %"),
    Column("figure.break_even_tokens", "break-even tokens"),
    Column("fixed_cost_ms", "fixed FP8 cost (ms)"),
    Column("fixed_cost_bf16_slope_tokens", "fixed cost (tokens of bf16 slope)"),
)

ROOFLINE_VS_PUBLISHED = (
    Column("figure", "figure"),
    Column("quantity", "quantity"),
    Column("published", "published"),
    Column("published_origin", "published origin"),
    Column("roofline", "roofline"),
    Column("basis", "roofline basis"),
    Column("gap", "published / roofline"),
    Column("assumed", "assumed"),
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


SLOPES = (
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

ARM_COMPARISONS = (
    Column("baseline", "baseline"),
    Column("candidate", "candidate"),
    Column("slope_ratio", "slope ratio"),
    Column("slope_ratio_ci", "ratio 95 % interval"),
    Column("break_even_tokens", "break-even (tokens)"),
    Column("break_even_ci", "break-even 95 % interval"),
    Column("statement", "statement"),
)

DOCS_VS_ROOFLINE = (
    Column("context", "context"),
    Column("tokens", "tokens"),
    Column("published_pct", "FP8 tok/s change (%), published"),
    Column("roofline_pct", "roofline gain (%), {row.users} user(s) assumed", format=lambda x: round(x, 2)),
    Column("gap", "published / roofline"),
    Column("origin", "origin"),
)


# --------------------------------------------------------------------------- notebooks 03 and 06 (accuracy)

CONTROL_PREFIX = "A/A control"
# The clustered error is 0 and an interval of width 0 would claim a certainty the data do not have,
# so none is given. For a paired difference that means no item differs between the two runs; for an
# accuracy, that every context scored the same share (its items may still differ within a context).
NO_VARIATION = "none (no item differs between the two runs)"
NO_VARIATION_ACCURACY = "none (every context scored the same share: no spread between contexts)"


def captured_settings(capture_dir: str | Path, run_missing: bool) -> dict[str, Any]:
    """The eval settings a capture was made with (``spec.settings`` of its manifest); empty when the
    folder holds no capture yet or live runs may add to it (``run_missing``)."""
    if run_missing or not (Path(capture_dir) / MANIFEST).is_file():
        return {}
    settings = (read_manifest(capture_dir).get("spec") or {}).get("settings")
    return dict(settings) if isinstance(settings, dict) else {}


# --------------------------------------------------------------------------- cell formats


def _hundred(decimals: int) -> Callable[[float], float]:
    """A fraction as percent or points, rounded (a number: the report table prints it)."""
    return lambda x: round(100 * x, decimals)


def _pct_range(low: float, high: float) -> str:
    """Two fractions as percent, e.g. '87.9 to 93.0'."""
    return f"{100 * low:.1f} to {100 * high:.1f}"


def _signed_range(low: float, high: float) -> str:
    """An interval of differences as signed points, e.g. '-4.5 to +2.5'."""
    return f"{100 * low:+.1f} to {100 * high:+.1f}"


def _interval(iv: DifferenceInterval) -> str:
    return _signed_range(iv.low, iv.high)


LABEL = Column("label", "configuration")
POINTS_1 = _hundred(1)

# --------------------------------------------------------------------------- notebook 03

PUBLISHED = (
    LABEL,
    Column("interval", "correct", format=lambda w: f"{w.correct}/{w.n}"),
    Column("interval.accuracy", "accuracy {unit}", "%", POINTS_1),
    Column("interval", "Wilson 95% (recomputed)", "%", lambda w: _pct_range(w.low, w.high)),
    Column("published_wilson95_pct", "Wilson 95% (published)", "%", lambda lh: f"{lh[0]:.1f} to {lh[1]:.1f}"),
    Column("matches", "matches to 0.1"),
)


def _loss_range(b: TotalsBounds) -> str:
    low, high = b.detectable_loss_low, b.detectable_loss_high
    return "none" if high is None else f"{100 * (low or high):.1f} to {100 * high:.1f}"


TOTALS = (
    LABEL,
    Column("bounds", "correct", format=lambda b: f"{b.candidate} vs {b.baseline} of {b.n}"),
    Column("bounds.mcnemar_p_min", "exact McNemar p, smallest possible", format=_p),
    Column("bounds.mcnemar_p_max", "exact McNemar p, largest possible", format=_p),
    Column("bounds", "runs disagree on ({unit})", "items", lambda b: f"{b.discordant_min} to {b.discordant_max}"),
    Column("bounds", "disagreement rate {unit}", "%", lambda b: _pct_range(b.disagreement_min, b.disagreement_max)),
    Column("bounds", "loss found with 80% power ({unit})", "points", _loss_range),
    Column("bounds.unpaired", "unpaired 95% interval (Newcombe, {unit})", "points", _interval),
)

CAPTURE = (
    LABEL,
    Column("state", "state"),
    Column("shots", "shots"),
    Column("interval", "correct", format=lambda w: "" if w is None else f"{w.correct}/{w.n}"),
    Column("interval", "accuracy {unit}", "%", lambda w: "" if w is None else f"{100 * w.accuracy:.1f}"),
    Column("interval", "Wilson 95%", "%", lambda w: "" if w is None else _pct_range(w.low, w.high)),
)
RETRIEVAL_CAPTURE = without(CAPTURE, "shots")  # a retrieval capture is asked zero-shot


def _guard_text(row: Any) -> str:
    if row.compared == "another model":
        return "not compared: another model by design (a weak baseline, not an A/B arm)"
    if row.compared == "no record":
        return "no resolved record to compare (the server did not start)"
    return "clean: only the intended change" if row.clean else "FLAGGED: also " + "; ".join(row.differences)


GUARD = (
    LABEL,
    Column("intended", "intended change", format=", ".join),
    Column("", "A/B guard", format=_guard_text),
)

PAIRED = (
    LABEL,
    Column("control", "role", format=lambda c: CONTROL_PREFIX + " (16-bit again)" if c else "candidate"),
    Column("comparison.counts.n", "items"),
    Column("comparison.counts.baseline_correct", "{row.comparison.baseline} right"),
    Column("comparison.counts.candidate_correct", "this right"),
    Column("comparison.counts.baseline_only", "only {row.comparison.baseline} right"),
    Column("comparison.counts.candidate_only", "only this right"),
    Column("comparison.difference", "difference ({unit})", "points", POINTS_1),
    Column("comparison.mcnemar_p", "exact McNemar p", format=_p),
    Column("comparison.interval", "95% interval (Newcombe, {unit})", "points", _interval),
    Column(
        "comparison.non_inferiority.non_inferior",
        "non-inferior at {row.comparison.non_inferiority.margin_points:g} points",
    ),
    Column(
        "by_share.non_inferior",
        "non-inferior at {row.by_share.share_pct:g}% of {row.comparison.baseline} "
        "({row.by_share.margin_points:.2f} points)",
        format=or_text("not defined (16-bit score 0)"),
    ),
    Column("", "identical responses", format=lambda r: f"{r.identical_responses}/{r.comparison.counts.n}"),
)

CUT_OFF = (
    LABEL,
    Column("answers", "answers"),
    Column("reached", "reached {row.limit} {row.measure}"),
    Column("wrong", "of these scored wrong"),
)

# --------------------------------------------------------------------------- notebook 06


def uninformative(interval: tuple[float, float] | None) -> bool:
    """True for an accuracy interval that spans every possible value (0 to 100 %): it says nothing."""
    return interval is not None and interval[0] <= 0.0 and interval[1] >= 1.0


def _clustered_pct(row: Any) -> str | None:
    if row.clustered is None:
        return None  # fewer than two contexts
    if row.interval is None:
        return NO_VARIATION_ACCURACY
    if uninformative(row.interval):
        return f"0 to 100: uninformative ({row.contexts} contexts)"
    return _pct_range(*row.interval)


RETRIEVAL_ACCURACY = (
    LABEL,
    Column("length", "context length ({unit})", "tokens"),
    Column("items", "items"),
    Column("contexts", "contexts"),
    Column("correct", "correct"),
    Column("accuracy", "accuracy {unit}", "%", _hundred(2)),
    Column("", "clustered 95% {unit}", "%", _clustered_pct),
    Column(
        "clustered",
        "design effect",
        format=lambda m: round(m.design_effect, 2) if m is not None and m.se_independent else None,
    ),
    Column("wilson", "Wilson 95% {unit} (ignores clusters)", "%", lambda w: _pct_range(w.low, w.high)),
)
RETRIEVAL_ACCURACY_BY_KIND = (
    LABEL,
    Column("kind", "kind"),
    *without(RETRIEVAL_ACCURACY, "Wilson 95% {unit} (ignores clusters)")[1:],
)


def _clustered_points(m: Any) -> str:
    return _signed_range(m.ci_low, m.ci_high) if m.varies else NO_VARIATION


RETRIEVAL_PAIRED = (
    LABEL,
    Column("control", "role", format=lambda c: CONTROL_PREFIX if c else "candidate"),
    Column("length", "context length ({unit})", "tokens", or_text("all")),
    Column("counts.n", "items"),
    Column("clustered.clusters", "contexts"),
    Column("counts.baseline_only", "only {row.baseline} right"),
    Column("counts.candidate_only", "only this right"),
    Column("mcnemar_p", "exact McNemar p", format=_p),
    Column("clustered.mean", "difference ({unit})", "points", POINTS_1),
    Column("clustered", "clustered 95% ({unit})", "points", _clustered_points),
    Column(
        "non_inferiority.non_inferior",
        "non-inferior at {row.non_inferiority.margin_points:g} points",
        format=or_text("not judged (no variation)"),
    ),
    Column(
        "clustered",
        "SE independent / clustered ({unit})",
        "points",
        lambda m: f"{100 * m.se_independent:.2f} / {100 * m.se_clustered:.2f}",
    ),
)


# --------------------------------------------------------------------------- sentences


def failure_lines(results: Mapping[str, ConfigResult]) -> list[str]:
    """'<label> (<state>): <diagnosis>' for every configuration without finished records."""
    return [
        f"{res.label} ({res.state}): {res.diagnosis or 'no diagnosis recorded'}"
        for res in results.values()
        if res.state != "ok"
    ]


def discrimination_sentence(d: Discrimination) -> str:
    """Whether the eval separates the model from the weak baseline, in words."""
    a, b = 100 * d.model_correct / d.n, 100 * d.weak_correct / d.n
    if d.discriminates:
        return (
            f"The eval discriminates: {d.model} scores {a:.1f}% against {b:.1f}% for "
            f"the weak baseline ({d.weak}) on the same {d.n} questions "
            f"(one-sided exact {p_text(d.p_value, 2)})."
        )
    return (
        f"The eval cannot discriminate here: {d.model} scores {a:.1f}% and the weak "
        f"baseline ({d.weak}) {b:.1f}% on the same {d.n} questions (one-sided exact "
        f"{p_text(d.p_value, 2)}), so no accuracy difference between configurations can "
        f"be read from it."
    )


def chance_sentence(c: ChanceCheck) -> str:
    """Whether the model retrieves better than picking one of each context's values at random."""
    if c.n == 0:
        return f"{c.label}: no retrieval records."
    verb = "retrieves better than chance" if c.better_than_chance else "does NOT retrieve better than chance"
    return (
        f"{c.label} {verb}: {c.right}/{c.n} right against {c.expected:.1f} expected by picking one of "
        f"each context's values at random ({100 * c.chance_min:.1f}% to {100 * c.chance_max:.1f}% an item; "
        f"one-sided exact Poisson-binomial {p_text(c.p_value, 2)})."
    )


def _non_inferiority_words(ni: NonInferiority) -> str:
    if ni.non_inferior is None:
        return "non-inferiority not judged (no item differs between the two runs)"
    return "non-inferior" if ni.non_inferior else "non-inferiority not shown"


def retrieval_sentence(rows: Iterable[RetrievalPaired], alpha: float = 0.05) -> str:
    """Each candidate over all lengths (difference, clustered interval, McNemar p, non-inferiority),
    then the context lengths at which the paired test shows a difference after Holm's correction
    over the report's per-length tests (one family)."""
    cands = [r for r in rows if not r.control]
    text = " ".join(
        f"{r.label}: {100 * r.clustered.mean:+.1f} points over all lengths (clustered 95% "
        f"{_clustered_points(r.clustered)}), exact McNemar p = {_p(r.mcnemar_p)}; "
        f"{_non_inferiority_words(r.non_inferiority)} at {r.non_inferiority.margin_points:g} points."
        for r in cands
        if r.length is None
    )
    by_length = [r for r in cands if r.length is not None]
    adjusted = holm([r.mcnemar_p for r in by_length])
    shown = [
        f"{r.label} at {r.length} tokens ({100 * r.clustered.mean:+.1f} points, p = {_p(r.mcnemar_p)}, "
        f"Holm p = {_p(p)})"
        for r, p in zip(by_length, adjusted)
        if p < alpha
    ]
    family = f"Holm over the {len(by_length)} per-length tests"
    return text + (
        f" The paired test shows a difference at the 5% level ({family}) at: " + "; ".join(shown) + "."
        if shown
        else f" At no single context length does the paired test show a difference at the 5% level ({family})."
    )
