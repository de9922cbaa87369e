"""Tables and sentences for the GSM8K notebook, from a published summary or a capture folder.

The statistics live in :mod:`kvstudy.accuracy.stats`; reading and running captures in
:mod:`kvstudy.accuracy.runner`. This module joins them into what the report shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvstudy.accuracy import stats as acc
from kvstudy.accuracy.configurations import CONFIGURATIONS
from kvstudy.accuracy.records import correctness
from kvstudy.accuracy.runner import ConfigResult
from kvstudy.errors import StudyError

ASSUMED_DISCORDANCE = (0.02, 0.05, 0.10)  # fractions of questions on which two runs disagree


# --------------------------------------------------------------------------- published summary


@dataclass(frozen=True)
class PublishedRow:
    name: str
    label: str
    correct: int
    published_accuracy_pct: float
    published_wilson95_pct: tuple[float, float]


@dataclass(frozen=True)
class PublishedSummary:
    path: Path
    meta: dict[str, Any]
    n: int
    baseline: str
    rows: list[PublishedRow]


def load_published(path: str | Path) -> PublishedSummary:
    """Read a published accuracy summary (counts only), checking each field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"{path}: no such published summary") from None
    except json.JSONDecodeError as exc:
        raise StudyError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("source") != "published":
        raise StudyError(f'{path}: expected a JSON object with "source": "published"')
    n = data.get("n")
    if not isinstance(n, int) or n <= 0:
        raise StudyError(f"{path}: field 'n' must be a positive integer, got {n!r}")
    rows = []
    for i, row in enumerate(data.get("rows") or []):
        try:
            low, high = row["published_wilson95_pct"]
            rows.append(
                PublishedRow(
                    str(row["name"]),
                    str(row["label"]),
                    int(row["correct"]),
                    float(row["published_accuracy_pct"]),
                    (float(low), float(high)),
                )
            )
        except (KeyError, TypeError, ValueError):
            raise StudyError(
                f"{path}: rows[{i}] needs name, label, correct, "
                f"published_accuracy_pct and published_wilson95_pct [low, high]"
            ) from None
        if not 0 <= rows[-1].correct <= n:
            raise StudyError(f"{path}: rows[{i}].correct must be between 0 and n={n}")
    if not rows:
        raise StudyError(f"{path}: field 'rows' is empty")
    baseline = str(data.get("baseline", rows[0].name))
    if baseline not in {r.name for r in rows}:
        raise StudyError(f"{path}: baseline {baseline!r} is not one of the rows")
    return PublishedSummary(path, {k: v for k, v in data.items() if k != "rows"}, n, baseline, rows)


def published_table(summary: PublishedSummary) -> pd.DataFrame:
    """Each published row with the Wilson interval recomputed here, and whether it matches."""
    out = []
    for row in summary.rows:
        ours = acc.accuracy_row(row.label, row.correct, summary.n)
        low, high = round(100 * ours.wilson_low, 1), round(100 * ours.wilson_high, 1)
        out.append(
            {
                "configuration": row.label,
                "correct": f"{row.correct}/{summary.n}",
                "accuracy %": round(100 * ours.accuracy, 1),
                "Wilson 95% (recomputed)": f"{low:.1f} to {high:.1f}",
                "Wilson 95% (published)": f"{row.published_wilson95_pct[0]:.1f} to {row.published_wilson95_pct[1]:.1f}",
                "matches to 0.1": (
                    abs(low - row.published_wilson95_pct[0]) < 0.05 + 1e-9
                    and abs(high - row.published_wilson95_pct[1]) < 0.05 + 1e-9
                    and abs(round(100 * ours.accuracy, 1) - row.published_accuracy_pct) < 0.05 + 1e-9
                ),
            }
        )
    return pd.DataFrame(out)


def published_verdicts(summary: PublishedSummary) -> list[str]:
    base = next(r for r in summary.rows if r.name == summary.baseline)
    base_row = acc.accuracy_row(base.label, base.correct, summary.n)
    return [
        acc.unpaired_verdict(base_row, acc.accuracy_row(r.label, r.correct, summary.n))
        for r in summary.rows
        if r.name != summary.baseline
    ]


# --------------------------------------------------------------------------- power


def power_table(n: int, discordances: Sequence[float] = ASSUMED_DISCORDANCE, loss: float | None = None) -> pd.DataFrame:
    """Per assumed discordance: the smallest loss n questions find with 80 % power (exact
    McNemar), and, if ``loss`` is given, the questions that loss would need."""
    rows = []
    for psi in discordances:
        mde = acc.smallest_detectable_loss(n, psi)
        row: dict[str, Any] = {
            "runs disagree on": f"{100 * psi:.0f}% of questions",
            f"smallest loss found at N={n} (80% power)": "none up to the discordance"
            if mde is None
            else f"{100 * mde:.1f} points",
        }
        if loss is not None:
            row[f"questions needed for a {100 * loss:.1f}-point loss"] = (
                f"{acc.required_questions(loss, psi):,}" if loss <= psi else "impossible (loss > discordance)"
            )
        rows.append(row)
    return pd.DataFrame(rows)


def power_sentence(n: int, discordances: Sequence[float] = ASSUMED_DISCORDANCE) -> str:
    mdes = [acc.smallest_detectable_loss(n, psi) for psi in discordances]
    parts = [
        f"{100 * m:.1f} points if the runs disagree on {100 * p:.0f}% of questions"
        for m, p in zip(mdes, discordances)
        if m is not None
    ]
    if not parts:
        return f"With {n} questions no loss is found with 80% power at these discordance rates."
    return (
        f"With {n} paired questions, the smallest loss found with 80% power is about "
        + "; ".join(parts)
        + ". Smaller losses can go unseen."
    )


# --------------------------------------------------------------------------- a capture


def capture_table(results: Mapping[str, ConfigResult], filter_name: str) -> pd.DataFrame:
    """One row per configuration: its state, and for finished ones the score and interval
    (the diagnoses of failed ones are in ``failure_lines``)."""
    rows = []
    for res in results.values():
        row: dict[str, Any] = {
            "configuration": res.label,
            "state": res.state,
            "shots": res.num_fewshot,
            "correct": "",
            "accuracy %": "",
            "Wilson 95%": "",
        }
        if res.state == "ok" and res.records:
            right = sum(correctness(res.records, filter_name).values())
            r = acc.accuracy_row(res.label, right, len(res.records))
            row.update(
                {
                    "correct": f"{right}/{r.n}",
                    "accuracy %": f"{100 * r.accuracy:.1f}",
                    "Wilson 95%": f"{100 * r.wilson_low:.1f} to {100 * r.wilson_high:.1f}",
                }
            )
        rows.append(row)
    table = pd.DataFrame(rows)
    table["shots"] = table["shots"].astype("Int64")
    return table


def failure_lines(results: Mapping[str, ConfigResult]) -> list[str]:
    """'<label> (<state>): <diagnosis>' for every configuration without finished records."""
    return [
        f"{res.label} ({res.state}): {res.diagnosis or 'no diagnosis recorded'}"
        for res in results.values()
        if res.state != "ok"
    ]


def _serves_another_model(name: str) -> bool:
    """Whether a configuration serves another model than the run's (a weak baseline by design)."""
    return name in CONFIGURATIONS and CONFIGURATIONS[name].model is not None


def paired_comparisons(
    results: Mapping[str, ConfigResult], baseline: str, filter_name: str
) -> tuple[pd.DataFrame, list[str]]:
    """Each finished configuration (few-shot, not the weak baseline) against the baseline on the
    same questions: the McNemar table, p-value, identical responses, and a verdict sentence."""
    base = _finished(results, baseline)
    base_correct = correctness(base.records, filter_name)
    base_resp = {r.doc_id: r.response for r in base.records}
    rows, verdicts = [], []
    for name, res in results.items():
        if name == baseline or res.state != "ok" or res.num_fewshot != base.num_fewshot:
            continue
        if _serves_another_model(name):  # a weak baseline, not an arm
            continue
        cmp = acc.compare_paired(base.label, base_correct, res.label, correctness(res.records, filter_name))
        psi = cmp.discordance_rate
        mde = acc.smallest_detectable_loss(cmp.n, psi) if psi > 0 else None
        same = sum(base_resp.get(r.doc_id) == r.response for r in res.records)
        rows.append(
            {
                "configuration": res.label,
                "both right": cmp.both_right,
                f"only {base.label} right": cmp.only_baseline_right,
                "only this right": cmp.only_other_right,
                "both wrong": cmp.both_wrong,
                "difference (points)": round(100 * cmp.difference, 1),
                "exact McNemar p": round(cmp.p_value, 4),
                "identical responses": f"{same}/{cmp.n}",
            }
        )
        verdicts.append(acc.paired_verdict(cmp, mde))
    return pd.DataFrame(rows), verdicts


def discrimination(results: Mapping[str, ConfigResult], model: str, weak: str, filter_name: str) -> acc.Discrimination:
    a, b = _finished(results, model), _finished(results, weak)
    return acc.discrimination_check(
        f"{a.label} ({a.num_fewshot}-shot)",
        correctness(a.records, filter_name),
        b.label,
        correctness(b.records, filter_name),
    )


def guard_table(results: Mapping[str, ConfigResult], baseline: str) -> pd.DataFrame:
    """Flag a configuration whose resolved record differs from the baseline's in more than the
    intended change (kvstudy.run_record.ab_guard)."""
    from kvstudy.run_record import ab_guard

    base = results.get(baseline)
    rows = []
    for name, res in results.items():
        if name == baseline:
            continue
        intended = CONFIGURATIONS[name].intended or ("nothing",)
        if _serves_another_model(name):
            rows.append(
                {
                    "configuration": res.label,
                    "intended change": ", ".join(intended),
                    "A/B guard": "not compared: another model by design (a weak baseline, not an A/B arm)",
                }
            )
            continue
        if base is None or base.resolved_record is None or res.resolved_record is None:
            rows.append(
                {
                    "configuration": res.label,
                    "intended change": ", ".join(intended),
                    "A/B guard": "no resolved record to compare (the server did not start)",
                }
            )
            continue
        diffs = ab_guard(base.resolved_record, res.resolved_record, intended=intended)
        rows.append(
            {
                "configuration": res.label,
                "intended change": ", ".join(intended),
                "A/B guard": "clean: only the intended change"
                if not diffs
                else "FLAGGED: also " + "; ".join(str(d) for d in diffs),
            }
        )
    return pd.DataFrame(rows)


def _finished(results: Mapping[str, ConfigResult], name: str) -> ConfigResult:
    res = results.get(name)
    if res is None or res.state != "ok":
        state = "absent" if res is None else res.state
        raise StudyError(f"configuration {name!r}: no finished records in the capture ({state})")
    return res
