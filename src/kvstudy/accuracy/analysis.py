"""Records for the GSM8K notebook (03), from a published summary or a capture folder.

The statistics live in :mod:`kvstudy.stats.binary` and :mod:`kvstudy.stats.binary_power`; reading
and running captures in :mod:`kvstudy.accuracy.runner`. This module joins them into typed records,
one per row of what the report shows; :mod:`kvstudy.report.tables` renders them (the notebooks
read the records' fields, never a table's text).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvstudy.accuracy.configurations import CONFIGURATIONS
from kvstudy.accuracy.records import correctness
from kvstudy.accuracy.runner import ConfigResult
from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.io import read_json
from kvstudy.stats import binary
from kvstudy.stats.binary import Discrimination, WilsonInterval

ASSUMED_DISCORDANCE = (0.02, 0.05, 0.10)  # fractions of questions on which two runs disagree


# --------------------------------------------------------------------------- published summary


class PublishedRow(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)

    name: str
    label: str
    correct: int = Field(ge=0)
    published_accuracy_pct: float
    published_wilson95_pct: tuple[float, float] = Field(strict=False)  # [low, high] in the file


class PublishedSummary(BaseModel):
    """A published accuracy summary (counts only) as its file holds it; its other keys are its meta."""

    model_config = ConfigDict(strict=True, extra="allow")

    source: Literal["published"]
    n: int = Field(gt=0)
    rows: list[PublishedRow] = Field(min_length=1)
    baseline: str = ""  # the file's, else the first row's

    @model_validator(mode="after")
    def _counts(self) -> Self:
        for i, row in enumerate(self.rows):
            if row.correct > self.n:
                raise ValueError(f"rows[{i}].correct must be between 0 and n={self.n}")
        self.baseline = self.baseline or self.rows[0].name
        if self.baseline not in {r.name for r in self.rows}:
            raise ValueError(f"baseline {self.baseline!r} is not one of the rows")
        return self

    @property
    def meta(self) -> dict[str, Any]:
        return self.model_dump(exclude={"rows"})


def load_published(path: str | Path) -> PublishedSummary:
    """Read a published accuracy summary, checking each field."""
    try:
        return PublishedSummary.model_validate(read_json(path))
    except ValidationError as exc:
        raise StudyError(f"{path}: {one_line(exc)}") from None


@dataclass(frozen=True)
class PublishedCheck:
    """A published row with its Wilson interval recomputed here, and whether the two agree."""

    name: str
    label: str
    interval: WilsonInterval  # recomputed from the published count
    published_accuracy_pct: float
    published_wilson95_pct: tuple[float, float]
    matches: bool  # accuracy and both limits reproduced to 0.1 point


def published_checks(summary: PublishedSummary) -> list[PublishedCheck]:
    """Each published row with the Wilson interval recomputed here, and whether it matches."""
    out = []
    for row in summary.rows:
        ours = binary.wilson_interval(row.correct, summary.n)
        recomputed = (round(100 * x, 1) for x in (ours.accuracy, ours.low, ours.high))
        published = (row.published_accuracy_pct, *row.published_wilson95_pct)
        matches = all(abs(a - b) < 0.05 + 1e-9 for a, b in zip(recomputed, published))
        out.append(
            PublishedCheck(row.name, row.label, ours, row.published_accuracy_pct, row.published_wilson95_pct, matches)
        )
    return out


# --------------------------------------------------------------------------- a capture


@dataclass(frozen=True)
class CaptureRow:
    """One configuration of a capture: its state and, when finished, its score."""

    name: str
    label: str
    state: str
    shots: int | None
    interval: WilsonInterval | None  # None: no finished records


def capture_rows(results: Mapping[str, ConfigResult], filter_name: str) -> list[CaptureRow]:
    """One row per configuration: its state, and for finished ones the score and interval
    (the diagnoses of failed ones: :func:`kvstudy.report.tables.failure_lines`)."""
    rows = []
    for res in results.values():
        interval = None
        if res.state == "ok" and res.records:
            interval = binary.wilson_interval(sum(correctness(res.records, filter_name).values()), len(res.records))
        rows.append(CaptureRow(res.name, res.label, res.state, res.num_fewshot, interval))
    return rows


def serves_another_model(name: str) -> bool:
    """Whether a configuration serves another model than the run's (a weak baseline by design)."""
    return name in CONFIGURATIONS and CONFIGURATIONS[name].model is not None


def discrimination(results: Mapping[str, ConfigResult], model: str, weak: str, filter_name: str) -> Discrimination:
    a, b = finished(results, model), finished(results, weak)
    return binary.discrimination_check(
        f"{a.label} ({a.num_fewshot}-shot)",
        correctness(a.records, filter_name),
        b.label,
        correctness(b.records, filter_name),
    )


@dataclass(frozen=True)
class GuardRow:
    """A configuration's resolved-run record against the baseline's (kvstudy.run_record.ab_guard)."""

    label: str
    intended: tuple[str, ...]
    compared: str  # "yes", "another model" (a weak baseline by design) or "no record"
    differences: tuple[str, ...] = ()  # beyond the intended change (compared == "yes")

    @property
    def clean(self) -> bool:
        return self.compared == "yes" and not self.differences


def guard_rows(results: Mapping[str, ConfigResult], baseline: str) -> list[GuardRow]:
    """Flag a configuration whose resolved record differs from the baseline's in more than the
    intended change."""
    from kvstudy.run_record import ab_guard

    base = results.get(baseline)
    rows = []
    for name, res in results.items():
        if name == baseline:
            continue
        intended = CONFIGURATIONS[name].intended or ("nothing",)
        if serves_another_model(name):
            rows.append(GuardRow(res.label, intended, "another model"))
        elif base is None or base.resolved_record is None or res.resolved_record is None:
            rows.append(GuardRow(res.label, intended, "no record"))
        else:
            diffs = ab_guard(base.resolved_record, res.resolved_record, intended=intended)
            rows.append(GuardRow(res.label, intended, "yes", tuple(str(d) for d in diffs)))
    return rows


def finished(results: Mapping[str, ConfigResult], name: str) -> ConfigResult:
    """The named configuration, which must have finished records."""
    res = results.get(name)
    if res is None or res.state != "ok":
        state = "absent" if res is None else res.state
        raise StudyError(f"configuration {name!r}: no finished records in the capture ({state})")
    return res
