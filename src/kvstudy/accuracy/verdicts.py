"""Typed records for the accuracy notebooks (03 GSM8K-format, 06 long-context retrieval), one per row
of what the report shows, from a published summary (counts only) or a capture's per-item records.

Every number comes from :mod:`kvstudy.stats.binary` (exact McNemar, Newcombe's paired interval,
non-inferiority at a margin, clustered errors, chance) and :mod:`kvstudy.stats.binary_power` (bounds
from totals); reading and running captures is :mod:`kvstudy.accuracy.runner`'s.
:mod:`kvstudy.report.tables` renders the records (the notebooks read their fields, never a table's text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
from kvstudy.stats import binary, binary_power
from kvstudy.stats.binary import (
    ChanceCheck,
    ClusteredMean,
    Discrimination,
    NonInferiority,
    PairedComparison,
    PairedCounts,
    WilsonInterval,
    clustered_difference,
    clustered_mean,
)
from kvstudy.stats.binary_power import TotalsBounds

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

    label: str
    interval: WilsonInterval  # recomputed from the published count
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
        out.append(PublishedCheck(row.label, ours, row.published_wilson95_pct, matches))
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


def _candidates(results: Mapping[str, ConfigResult], baseline: str) -> list[ConfigResult]:
    """Finished configurations of the run's model asked like the baseline (same shots), the
    baseline left out (a weak baseline on another model is no arm)."""
    base = results[baseline]
    return [
        r
        for name, r in results.items()
        if name != baseline and r.state == "ok" and r.num_fewshot == base.num_fewshot and not serves_another_model(name)
    ]


def is_control(name: str) -> bool:
    """A 16-bit configuration started again: its difference from the baseline is the noise floor."""
    return name.startswith("bf16-repeat")


# --------------------------------------------------------------------------- GSM8K-format


@dataclass(frozen=True)
class PairedRow:
    """A configuration against the baseline on the same questions."""

    name: str
    control: bool  # the 16-bit configuration again (the noise floor), not a candidate
    comparison: PairedComparison  # non-inferiority at the margin in points
    by_share: NonInferiority  # non-inferiority at a share of the 16-bit score
    identical_responses: int  # questions answered with the very same text

    @property
    def label(self) -> str:
        return self.comparison.candidate


def paired_rows(
    results: Mapping[str, ConfigResult], baseline: str, filter_name: str, margin_points: float, margin_share: float
) -> list[PairedRow]:
    """Each finished configuration against the baseline on the same items (binary.compare),
    non-inferiority judged at a margin in points and at a share of the baseline's score."""
    base = finished(results, baseline)
    base_correct = correctness(base.records, filter_name)
    base_resp = {r.doc_id: r.response for r in base.records}
    rows = []
    for res in _candidates(results, baseline):
        cmp = binary.compare(
            base_correct,
            correctness(res.records, filter_name),
            margin_points=margin_points,
            baseline_label=base.label,
            candidate_label=res.label,
        )
        c = cmp.counts
        share_margin = binary.resolve_margin(c.baseline_correct / c.n, margin_share=margin_share)
        # a share of a 16-bit score of 0 is a margin of 0: no interval can lie above it (not judged)
        by_share = binary.non_inferiority(cmp.interval.low, share_margin, share=margin_share)
        same = sum(base_resp.get(r.doc_id) == r.response for r in res.records)
        rows.append(PairedRow(res.name, is_control(res.name), cmp, by_share, same))
    return rows


@dataclass(frozen=True)
class TotalsRow:
    """A published row against the published baseline: what the totals allow over every pairing."""

    name: str
    label: str
    bounds: TotalsBounds


def totals_rows(summary: PublishedSummary) -> list[TotalsRow]:
    """For each published row against the baseline: what the totals allow over every pairing."""
    base = next(r for r in summary.rows if r.name == summary.baseline)
    return [
        TotalsRow(row.name, row.label, binary_power.totals_bounds(summary.n, base.correct, row.correct))
        for row in summary.rows
        if row.name != summary.baseline
    ]


# --------------------------------------------------------------------------- cut-off answers


def token_counter(model_dir: str | Path) -> Callable[[str], int] | None:
    """Count tokens with the model folder's ``tokenizer.json`` (None when it has none)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True)
class CutOffRow:
    """A configuration's answers whose length reached the generation limit."""

    label: str
    answers: int
    reached: int  # answers at least ``limit`` long
    wrong: int  # of these, scored wrong
    limit: int
    measure: str  # "tokens (model tokenizer)" or "words (a lower bound)"


def cut_off_rows(
    results: Mapping[str, ConfigResult], max_gen_toks: int, count_tokens: Callable[[str], int] | None
) -> list[CutOffRow]:
    """Per finished configuration: answers whose length reached the generation limit, in tokens with
    ``count_tokens``, else in words (a lower bound: lm-eval does not log why generation stopped).
    """
    measure = count_tokens or (lambda text: len(text.split()))
    how = "tokens (model tokenizer)" if count_tokens else "words (a lower bound)"
    rows = []
    for res in results.values():
        if res.state != "ok":
            continue
        cut = [r for r in res.records if measure(r.response) >= max_gen_toks]
        wrong = sum(not r.correct() for r in cut)  # under the task's first filter
        rows.append(CutOffRow(res.label, len(res.records), len(cut), wrong, max_gen_toks, how))
    return rows


# --------------------------------------------------------------------------- retrieval


@dataclass(frozen=True)
class RetrievalAccuracy:
    """A configuration's accuracy at one context length (and kind)."""

    label: str
    kind: str  # "kv", "needle", or "all" (both kinds)
    length: int  # the context length the generator aimed at (tokens)
    items: int
    contexts: int
    correct: int
    clustered: ClusteredMean | None  # None: fewer than two contexts
    wilson: WilsonInterval  # ignores the clusters

    @property
    def accuracy(self) -> float:
        return self.correct / self.items

    @property
    def interval(self) -> tuple[float, float] | None:
        """The clustered 95 % interval clipped to [0, 1] (None: no clustered error, or every item
        scored alike, where an interval of width 0 would claim a certainty the data lack)."""
        m = self.clustered
        if m is None or not m.varies:
            return None
        return max(0.0, m.ci_low), min(1.0, m.ci_high)


def retrieval_accuracy(
    results: Mapping[str, ConfigResult], filter_name: str, by_kind: bool = False
) -> list[RetrievalAccuracy]:
    """Accuracy per configuration and context length (and kind), with the clustered 95 % interval
    (items sharing a context are one cluster) and the Wilson interval, which ignores the clusters."""
    rows = []
    for res in results.values():
        if res.state != "ok":
            continue
        groups = sorted({(r.kind if by_kind else "all", r.target_tokens) for r in res.records})
        for kind, length in groups:
            items = [r for r in res.records if r.target_tokens == length and kind in ("all", r.kind)]
            right = [float(r.correct(filter_name)) for r in items]
            m = clustered_mean(right, [r.context_id for r in items])
            clustered = m if m.clusters >= 2 else None  # None: fewer than two contexts at this length
            correct, contexts = int(sum(right)), len({r.context_id for r in items})
            wilson = binary.wilson_interval(correct, len(items))
            rows.append(RetrievalAccuracy(res.label, kind, length, len(items), contexts, correct, clustered, wilson))
    return rows


@dataclass(frozen=True)
class RetrievalPaired:
    """A configuration against the baseline at one context length (or over all of them)."""

    name: str
    label: str
    baseline: str  # label
    control: bool
    length: int | None  # None: every length together
    counts: PairedCounts
    mcnemar_p: float  # two-sided exact McNemar p
    clustered: ClusteredMean  # of candidate minus baseline, clustered by context
    non_inferiority: NonInferiority  # judged on the clustered interval (not judged without variation)


def retrieval_paired(
    results: Mapping[str, ConfigResult], baseline: str, filter_name: str, margin_points: float
) -> list[RetrievalPaired]:
    """Each finished configuration against the baseline, per context length and overall: the
    discordant items, exact McNemar p, the difference with its clustered 95 % interval, and
    non-inferiority at ``margin_points`` judged on that interval (its lower limit above -margin)."""
    base = results[baseline]
    base_correct = correctness(base.records, filter_name)
    lengths: list[int | None] = [*sorted({r.target_tokens for r in base.records}), None]
    rows = []
    for res in _candidates(results, baseline):
        cand = correctness(res.records, filter_name)
        for length in lengths:
            keep = [r for r in base.records if length is None or r.target_tokens == length]
            b = {r.doc_id: base_correct[r.doc_id] for r in keep}
            c = {k: v for k, v in cand.items() if k in b}
            counts = binary.paired_counts(b, c, f"{res.label} vs {base.label}")
            cl = clustered_difference(b, c, {r.doc_id: r.context_id for r in keep})
            p = binary.mcnemar_exact(counts.baseline_only, counts.candidate_only)
            ni = binary.non_inferiority(cl.ci_low if cl.varies else None, margin_points / 100)
            control = is_control(res.name)
            rows.append(RetrievalPaired(res.name, res.label, base.label, control, length, counts, p, cl, ni))
    return rows


def chance_check(result: ConfigResult, filter_name: str, alpha: float = binary.ALPHA) -> ChanceCheck:
    """Does the model retrieve better than a random pick of one of the context's ``n_keys`` values?"""
    records = result.records
    return binary.chance_check(
        result.label, [r.correct(filter_name) for r in records], [1.0 / max(1, r.n_keys) for r in records], alpha
    )


# --------------------------------------------------------------------------- what a design can see


@dataclass(frozen=True)
class DetectableLoss:
    """The smallest accuracy loss (points) a paired design finds with 80 % power, and its basis."""

    points: float | None  # None: no loss of any size at this n
    basis: str

    def sentence(self, unit: str = "questions") -> str:
        if self.points is None:
            return (
                f"This design ({unit}, exact McNemar) could not detect a loss of any size at 80 % power ({self.basis})."
            )
        return (
            f"The smallest loss this design detects at 80 % power is {self.points:.1f} points ({self.basis}); "
            "a smaller loss would go unseen."
        )


def detectable_loss(n: int, discordant: int, clustered: bool = False) -> DetectableLoss:
    """At the observed share of disagreeing items (``binary_power.smallest_detectable_loss``); where they
    never disagree, at the best case (every disagreement against the candidate, the smallest rate at
    which any loss is found). ``clustered``: items share contexts, and the item-level test ignores
    that, so the value is a lower bound."""
    extra = "; items share contexts, so this item-level figure is a lower bound" if clustered else ""
    rate = discordant / n
    loss = binary_power.smallest_detectable_loss(n, rate) if discordant else None
    if loss is not None:
        return DetectableLoss(100 * loss, f"n = {n}, at the observed disagreement of {100 * rate:.1f} %{extra}")
    floor = binary_power.power_floor(n, binary.TARGET_POWER, binary.ALPHA)
    if floor is None:
        return DetectableLoss(None, f"n = {n}{extra}")
    why = (
        "the runs never disagree" if not discordant else f"the observed disagreement of {100 * rate:.1f} % is too small"
    )
    return DetectableLoss(100 * floor, f"n = {n}; {why}, so at best, every disagreement against the candidate{extra}")


# --------------------------------------------------------------------------- verdicts in words (notebook 03, kvstudy accuracy-compare)


def _points(x: float) -> str:
    """A difference as signed points with a true minus sign, for sentences."""
    return f"{100 * x:+.1f}".replace("-", "\u2212")


def paired_sentence(cmp: PairedComparison) -> str:
    """The verdict of one paired comparison: the counts, the test, the interval and the margin."""
    c, base, cand, alpha = cmp.counts, cmp.baseline, cmp.candidate, cmp.alpha
    p, low, high = cmp.mcnemar_p, cmp.interval.low, cmp.interval.high
    level = round(100 * (1 - alpha))
    head = (
        f"{cand}: {c.candidate_correct}/{c.n} against {c.baseline_correct}/{c.n} for {base} "
        f"({_points(c.difference)} points); the runs disagree on {c.discordant} items "
        f"({c.baseline_only} only {base} right, {c.candidate_only} only {cand} right); "
        f"exact McNemar p = {p:.3g}; {level}% interval of the difference (Newcombe, paired) "
        f"{_points(low)} to {_points(high)} points."
    )
    if c.discordant == 0:
        test = " Both runs got exactly the same items right."
    elif p < alpha:
        word = "lower" if c.difference < 0 else "higher"
        test = f" The paired test shows {cand} scoring {word} than {base} at the {100 * alpha:g}% level."
    else:
        test = (
            f" The paired test shows no difference at the {100 * alpha:g}% level, which is not "
            f"proof that there is none."
        )
    margin = cmp.non_inferiority.margin
    if cmp.non_inferiority.non_inferior:
        ni = (
            f" Non-inferior at a margin of {100 * margin:.2f} points: the interval's lower "
            f"limit ({_points(low)}) is above {_points(-margin)}."
        )
    else:
        ni = (
            f" Non-inferiority at a margin of {100 * margin:.2f} points is not shown: the "
            f"interval reaches down to {_points(low)} points."
        )
    return head + test + ni


def totals_sentence(t: TotalsBounds) -> str:
    """What published totals allow, in words."""
    level = round(100 * (1 - t.alpha))
    head = (
        f"From totals alone ({t.candidate}/{t.n} against {t.baseline}/{t.n}, "
        f"{_points(t.difference)} points) the pairing of items is unknown. "
    )
    if t.mcnemar_p_min >= t.alpha:
        test = (
            f"No pairing gives an exact McNemar p below {t.mcnemar_p_min:.3g}, so these totals "
            f"cannot show a difference at the {100 * t.alpha:g}% level whatever the per-item "
            f"records are. "
        )
    else:
        test = (
            f"The exact McNemar p lies between {t.mcnemar_p_min:.3g} and "
            f"{t.mcnemar_p_max:.3g} depending on the pairing; only per-item records can tell "
            f"whether the difference is significant. "
        )
    rates = f"The runs disagree on {100 * t.disagreement_min:.1f}% to {100 * t.disagreement_max:.1f}% of the items"
    pw = f"{100 * t.power:g}%"
    if t.detectable_loss_high is None:
        power = f"{rates}; at none of these rates does the paired exact test find a loss with {pw} power. "
    elif t.power_floor is not None and t.power_floor > t.disagreement_min:
        power = (
            f"{rates}; below {100 * t.power_floor:.1f}% disagreement no loss is found with "
            f"{pw} power, and above it the paired exact test finds only a loss of at least "
            f"{100 * (t.detectable_loss_low or 0):.1f} to {100 * (t.detectable_loss_high or 0):.1f} points. "
        )
    else:
        power = (
            f"{rates}; over that range the paired exact test finds with {pw} power only a "
            f"loss of at least {100 * (t.detectable_loss_low or 0):.1f} to "
            f"{100 * (t.detectable_loss_high or 0):.1f} points. "
        )
    ci = (
        f"The unpaired {level}% interval of the difference (Newcombe hybrid score) is "
        f"{_points(t.unpaired.low)} to {_points(t.unpaired.high)} points."
    )
    return head + test + power + ci
