"""The accuracy reports' presentation: the column specs of notebooks 03 and 06, and their verdict sentences.

The statistics (:mod:`kvstudy.stats.binary`, :mod:`kvstudy.stats.binary_power`) and the records of
notebooks 03 and 06 (:mod:`kvstudy.accuracy.analysis`, :mod:`kvstudy.accuracy.verdicts`) carry
numbers only; this module is the one place that turns them into text. Each table is a
:class:`kvstudy.report.tables.Table` (:func:`kvstudy.report.tables.render` makes its DataFrame).
Notebooks read the records' fields for their own conclusions, never a rendered cell.

Signs: a difference is candidate minus baseline, in points (hundredths), shown with its sign.
Overlapping Wilson intervals are never used as a test, and no sentence here says they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvstudy.accuracy.runner import ConfigResult
from kvstudy.accuracy.verdicts import RetrievalPaired
from kvstudy.capture import MANIFEST, read_manifest
from kvstudy.formats import p_text
from kvstudy.report.tables import Column, Table, or_text
from kvstudy.stats.binary import (
    ChanceCheck,
    DifferenceInterval,
    Discrimination,
    NonInferiority,
)
from kvstudy.stats.binary_power import TotalsBounds
from kvstudy.stats.family import holm

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


def _p(p: float) -> str:
    """A p-value with three significant digits (tables print floats at fixed decimals)."""
    return f"{p:.3g}"


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

PUBLISHED = Table(
    (
        LABEL,
        Column("interval", "correct", format=lambda w: f"{w.correct}/{w.n}"),
        Column("interval.accuracy", "accuracy {unit}", "%", POINTS_1),
        Column("interval", "Wilson 95% (recomputed)", "%", lambda w: _pct_range(w.low, w.high)),
        Column("published_wilson95_pct", "Wilson 95% (published)", "%", lambda lh: f"{lh[0]:.1f} to {lh[1]:.1f}"),
        Column("matches", "matches to 0.1"),
    )
)


def _loss_range(b: TotalsBounds) -> str:
    low, high = b.detectable_loss_low, b.detectable_loss_high
    return "none" if high is None else f"{100 * (low or high):.1f} to {100 * high:.1f}"


TOTALS = Table(
    (
        LABEL,
        Column("bounds", "correct", format=lambda b: f"{b.candidate} vs {b.baseline} of {b.n}"),
        Column("bounds.mcnemar_p_min", "exact McNemar p, smallest possible", format=_p),
        Column("bounds.mcnemar_p_max", "exact McNemar p, largest possible", format=_p),
        Column("bounds", "runs disagree on ({unit})", "items", lambda b: f"{b.discordant_min} to {b.discordant_max}"),
        Column("bounds", "disagreement rate {unit}", "%", lambda b: _pct_range(b.disagreement_min, b.disagreement_max)),
        Column("bounds", "loss found with 80% power ({unit})", "points", _loss_range),
        Column("bounds.unpaired", "unpaired 95% interval (Newcombe, {unit})", "points", _interval),
    )
)

CAPTURE = Table(
    (
        LABEL,
        Column("state", "state"),
        Column("shots", "shots"),
        Column("interval", "correct", format=lambda w: "" if w is None else f"{w.correct}/{w.n}"),
        Column("interval", "accuracy {unit}", "%", lambda w: "" if w is None else f"{100 * w.accuracy:.1f}"),
        Column("interval", "Wilson 95%", "%", lambda w: "" if w is None else _pct_range(w.low, w.high)),
    )
)
RETRIEVAL_CAPTURE = CAPTURE.without("shots")  # a retrieval capture is asked zero-shot


def _guard_text(row: Any) -> str:
    if row.compared == "another model":
        return "not compared: another model by design (a weak baseline, not an A/B arm)"
    if row.compared == "no record":
        return "no resolved record to compare (the server did not start)"
    return "clean: only the intended change" if row.clean else "FLAGGED: also " + "; ".join(row.differences)


GUARD = Table(
    (
        LABEL,
        Column("intended", "intended change", format=", ".join),
        Column("", "A/B guard", format=_guard_text),
    )
)

PAIRED = Table(
    (
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
)

CUT_OFF = Table(
    (
        LABEL,
        Column("answers", "answers"),
        Column("reached", "reached {row.limit} {row.measure}"),
        Column("wrong", "of these scored wrong"),
    )
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


RETRIEVAL_ACCURACY = Table(
    (
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
)
RETRIEVAL_ACCURACY_BY_KIND = Table(
    (LABEL, Column("kind", "kind"), *RETRIEVAL_ACCURACY.without("Wilson 95% {unit} (ignores clusters)").columns[1:])
)


def _clustered_points(m: Any) -> str:
    return _signed_range(m.ci_low, m.ci_high) if m.varies else NO_VARIATION


RETRIEVAL_PAIRED = Table(
    (
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
