"""``kvstudy accuracy``: paired verdicts from lm-eval sample files, or bounds from published totals.

    kvstudy accuracy compare BASE CAND [--filter NAME] [--metric exact_match]
                                       [--margin-points X | --margin-share S] [--json]
    kvstudy accuracy totals --n N --baseline A --candidate B [--json]

Numbers are parsed here rather than by argparse so that a bad one is a single line
(``kvstudy: error: ...``) with exit status 2, like every other bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

from kvstudy.accuracy import samples
from kvstudy.accuracy.verdicts import paired_sentence, totals_sentence
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_ITEMS
from kvstudy.stats import binary, binary_power


def _whole(text: str, field: str) -> int:
    """A whole number from the command line, at most ``MAX_ITEMS``, or a StudyError naming the option
    (a negative count is left to the totals' own check, which names the count)."""
    if not isinstance(text, str) or not re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", text):
        raise StudyError(f"{field}: expected a whole number, got {str(text)[:40]!r}")
    value = int(text)
    if value > MAX_ITEMS:
        raise StudyError(f"{field}: {value} is above the maximum {MAX_ITEMS:,} items")
    return value


def _number(text: str | None, field: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise StudyError(f"{field}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise StudyError(f"{field}: expected a finite number, got {text!r}")
    return value


def _print(data: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(data, indent=2, allow_nan=False))
    else:
        print("\n".join(lines))


def _compare_json(cmp: binary.PairedComparison) -> dict[str, Any]:
    """The keys of ``kvstudy accuracy compare --json`` (interval and margin in points)."""
    c = cmp.counts
    return {
        "n": c.n,
        "correct": {"baseline": c.baseline_correct, "candidate": c.candidate_correct},
        "discordant": {"baseline_only": c.baseline_only, "candidate_only": c.candidate_only},
        "mcnemar_p": cmp.mcnemar.p_value,
        "difference_points": 100 * cmp.difference,
        "difference_ci": [100 * cmp.interval.low, 100 * cmp.interval.high],
        "margin_points": cmp.non_inferiority.margin_points,
        "non_inferior": cmp.non_inferiority.non_inferior,
        "verdict": paired_sentence(cmp),
    }


def _totals_json(t: binary_power.TotalsBounds) -> dict[str, Any]:
    """The keys of ``kvstudy accuracy totals --json`` (rates and losses in percent/points)."""

    def pts(x: float | None) -> float | None:
        return None if x is None else 100 * x

    return {
        "n": t.n,
        "correct": {"baseline": t.baseline, "candidate": t.candidate},
        "mcnemar_p_min": t.mcnemar_p_min,
        "mcnemar_p_max": t.mcnemar_p_max,
        "discordant_range": [t.discordant_min, t.discordant_max],
        "disagreement_rate_pct": [100 * t.discordant_min / t.n, 100 * t.discordant_max / t.n],
        "detectable_loss_points": [pts(t.detectable_loss_low), pts(t.detectable_loss_high)],
        "power_floor_disagreement_pct": pts(t.power_floor),
        "unpaired_difference_ci": [pts(t.unpaired.low), pts(t.unpaired.high)],
        "verdict": totals_sentence(t),
    }


def _run_compare(args: argparse.Namespace) -> int:
    margin_points = _number(args.margin_points, "--margin-points")
    margin_share = _number(args.margin_share, "--margin-share")
    pair = samples.read_pair(args.baseline, args.candidate, args.filter, args.metric)
    verdict = binary.compare(
        pair.baseline_correct(),
        pair.candidate_correct(),
        margin_points=margin_points,
        margin_share=margin_share,
        baseline_label="baseline",
        candidate_label="candidate",
    )
    cuts = [samples.cut_off_answers(s) for s in (pair.baseline, pair.candidate)]
    data = {
        **_compare_json(verdict),
        "task": pair.baseline.task or pair.candidate.task,
        "filter": args.filter,
        "metric": args.metric,
        "same_prompts": pair.same_prompts,
        "cut_off": {
            "baseline": list(cuts[0].cut_off) if cuts[0].method != "not checked" else None,
            "candidate": list(cuts[1].cut_off) if cuts[1].method != "not checked" else None,
        },
    }
    c = verdict.counts
    lines = [
        f"items paired by doc_id: {c.n} ({args.filter}, {args.metric})",
        f"correct: baseline {c.baseline_correct}, candidate {c.candidate_correct}",
        f"discordant: baseline only {c.baseline_only}, candidate only {c.candidate_only}",
        f"exact McNemar p (two-sided): {verdict.mcnemar.p_value:.4g}",
        f"95% interval of candidate - baseline (Newcombe, paired): "
        f"{100 * verdict.interval.low:+.2f} to {100 * verdict.interval.high:+.2f} points",
        f"non-inferior at {verdict.non_inferiority.margin_points:.2f} points: {verdict.non_inferiority.non_inferior}",
        *(t.sentence() for t in cuts),
        "",
        str(data["verdict"]),
    ]
    if pair.same_prompts is False:
        lines.insert(-2, "note: the prompts differ between the runs (prompt_hash).")
    _print(data, args.json, lines)
    return 0


def _run_totals(args: argparse.Namespace) -> int:
    n = _whole(args.n, "--n")
    a = _whole(args.baseline, "--baseline")
    b = _whole(args.candidate, "--candidate")
    bounds = binary_power.totals_bounds(n, a, b)
    data = _totals_json(bounds)
    low, high = bounds.detectable_loss_low, bounds.detectable_loss_high
    loss = (
        "none at 80% power"
        if high is None or low is None
        else f"{100 * low:.1f} to {100 * high:.1f} points (80% power, exact paired test)"
    )
    lines = [
        f"exact McNemar p over all pairings: {bounds.mcnemar_p_min:.4g} to {bounds.mcnemar_p_max:.4g}",
        f"disagreement rate: {100 * bounds.discordant_min / n:.1f}% to "
        f"{100 * bounds.discordant_max / n:.1f}% ({bounds.discordant_min} to "
        f"{bounds.discordant_max} items)",
        f"detectable loss: {loss}",
        f"unpaired 95% interval of candidate - baseline (Newcombe): "
        f"{100 * bounds.unpaired.low:+.2f} to {100 * bounds.unpaired.high:+.2f} points",
        "",
        str(data["verdict"]),
    ]
    _print(data, args.json, lines)
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy accuracy compare`` and ``kvstudy accuracy totals``."""
    parser = subparsers.add_parser(
        "accuracy", help="paired accuracy verdicts (lm-eval samples or totals)", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="accuracy_command", required=True)

    cmp = sub.add_parser("compare", help="pair two lm-eval --log_samples files by doc_id")
    cmp.add_argument("baseline", help="the 16-bit run's samples_<task>_<date>.jsonl")
    cmp.add_argument("candidate", help="the candidate run's samples file (e.g. FP8 KV)")
    cmp.add_argument(
        "--filter", default=samples.DEFAULT_FILTER, help=f"lm-eval filter to score (default {samples.DEFAULT_FILTER})"
    )
    cmp.add_argument(
        "--metric", default=samples.DEFAULT_METRIC, help=f"per-item metric, 0 or 1 (default {samples.DEFAULT_METRIC})"
    )
    margin = cmp.add_mutually_exclusive_group()
    margin.add_argument(
        "--margin-points", default=None, metavar="X", help="non-inferiority margin in percentage points"
    )
    margin.add_argument(
        "--margin-share",
        default=None,
        metavar="S",
        help=f"margin as a share of the 16-bit score kept (default {binary.DEFAULT_MARGIN_SHARE}, MLPerf's 99%%)",
    )
    cmp.add_argument("--json", action="store_true", help="print one JSON object")
    cmp.set_defaults(func=_run_compare)

    tot = sub.add_parser("totals", help="what published totals allow, over every pairing")
    tot.add_argument("--n", required=True, help="number of items")
    tot.add_argument("--baseline", required=True, help="items the 16-bit run got right")
    tot.add_argument("--candidate", required=True, help="items the candidate got right")
    tot.add_argument("--json", action="store_true", help="print one JSON object")
    tot.set_defaults(func=_run_totals)
