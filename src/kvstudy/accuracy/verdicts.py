"""Report tables of paired accuracy verdicts, from a capture's per-item records or published totals.

Every number comes from :mod:`kvstudy.accuracy.paired` (exact McNemar, Newcombe's paired interval,
non-inferiority at a margin, bounds from totals, clustered errors); this module only arranges them
for notebooks 03 (GSM8K-format) and 06 (long-context retrieval). Overlapping Wilson intervals are
never used as a test here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from kvstudy.accuracy import paired
from kvstudy.accuracy.analysis import PublishedSummary
from kvstudy.accuracy.records import correctness
from kvstudy.accuracy.runner import ConfigResult
from kvstudy.accuracy.stats import wilson_interval
from kvstudy.errors import StudyError

CONTROL_PREFIX = "A/A control"
# every item scored alike (e.g. all wrong in both runs): the clustered error is 0 and an interval
# of width 0 would claim a certainty the data do not have, so none is given
NO_VARIATION = "none (every item scored alike)"


def _by_item(results: ConfigResult, filter_name: str, ids: set[int] | None = None) -> dict[Hashable, bool]:
    """Item id -> correct, the input of kvstudy.accuracy.paired (``ids``: only these items)."""
    return {k: v for k, v in correctness(results.records, filter_name).items() if ids is None or k in ids}


def _pts(x: float) -> float:
    return round(100 * x, 2)


def _range(low: float, high: float) -> str:
    """An interval of fractions as signed points, e.g. '-4.5 to +2.5'."""
    return f"{100 * low:+.1f} to {100 * high:+.1f}"


def _p(p: float) -> str:
    """A p-value as text with three significant digits (tables print floats at fixed decimals)."""
    return f"{p:.3g}"


def _candidates(results: Mapping[str, ConfigResult], baseline: str) -> list[ConfigResult]:
    """Finished configurations asked like the baseline (same shots), the baseline left out."""
    base = results[baseline]
    return [
        r for name, r in results.items() if name != baseline and r.state == "ok" and r.num_fewshot == base.num_fewshot
    ]


def is_control(name: str) -> bool:
    """A 16-bit configuration started again: its difference from the baseline is the noise floor."""
    return name.startswith("bf16-repeat")


def paired_verdicts(
    results: Mapping[str, ConfigResult], baseline: str, filter_name: str, margin_points: float, margin_share: float
) -> tuple[pd.DataFrame, list[paired.PairedVerdict]]:
    """Each finished configuration against the baseline on the same items (paired.compare),
    non-inferiority judged at a margin in points and at a share of the baseline's score."""
    base = results.get(baseline)
    if base is None or base.state != "ok":
        raise StudyError(f"configuration {baseline!r}: no finished records to compare against")
    base_correct = _by_item(base, filter_name)
    rows, verdicts = [], []
    for res in _candidates(results, baseline):
        cand = _by_item(res, filter_name)
        by_points = paired.compare(
            base_correct, cand, margin_points=margin_points, baseline_label=base.label, candidate_label=res.label
        )
        c = by_points.counts
        share_margin = paired.resolve_margin(c.baseline_correct / c.n, margin_share=margin_share)
        # a share of a 16-bit score of 0 is a margin of 0: no interval can lie above it
        by_share = (
            paired.non_inferior(by_points.ci_low, share_margin) if share_margin > 0 else "not defined (16-bit score 0)"
        )
        same = sum(a.response == b.response for a, b in zip(base.records, res.records))
        rows.append(
            {
                "configuration": res.label,
                "role": CONTROL_PREFIX + " (16-bit again)" if is_control(res.name) else "candidate",
                "items": c.n,
                f"{base.label} right": c.baseline_correct,
                "this right": c.candidate_correct,
                f"only {base.label} right": c.baseline_only,
                "only this right": c.candidate_only,
                "difference (points)": round(100 * c.difference, 1),
                "exact McNemar p": _p(by_points.mcnemar_p),
                "95% interval (Newcombe, points)": _range(by_points.ci_low, by_points.ci_high),
                f"non-inferior at {margin_points:g} points": by_points.non_inferior,
                f"non-inferior at {100 * margin_share:g}% of {base.label} ({100 * share_margin:.2f} points)": by_share,
                "identical responses": f"{same}/{c.n}",
            }
        )
        verdicts.append(by_points)
    return pd.DataFrame(rows), verdicts


def totals_table(summary: PublishedSummary) -> tuple[pd.DataFrame, list[paired.TotalsBounds]]:
    """For each published row against the baseline: what the totals allow over every pairing."""
    base = next(r for r in summary.rows if r.name == summary.baseline)
    rows, bounds = [], []
    for row in summary.rows:
        if row.name == summary.baseline:
            continue
        b = paired.totals_bounds(summary.n, base.correct, row.correct)
        low, high = b.detectable_loss_low, b.detectable_loss_high
        rows.append(
            {
                "configuration": row.label,
                "correct": f"{row.correct} vs {base.correct} of {summary.n}",
                "exact McNemar p, smallest possible": _p(b.mcnemar_p_min),
                "exact McNemar p, largest possible": _p(b.mcnemar_p_max),
                "runs disagree on (items)": f"{b.discordant_min} to {b.discordant_max}",
                "disagreement rate %": f"{100 * b.disagreement_min:.1f} to {100 * b.disagreement_max:.1f}",
                "loss found with 80% power (points)": (
                    "none" if high is None else f"{100 * (low or high):.1f} to {100 * high:.1f}"
                ),
                "unpaired 95% interval (Newcombe, points)": _range(b.unpaired_ci_low, b.unpaired_ci_high),
            }
        )
        bounds.append(b)
    return pd.DataFrame(rows), bounds


# --------------------------------------------------------------------------- cut-off answers


def token_counter(model_dir: str | Path) -> Callable[[str], int] | None:
    """Count tokens with the model folder's ``tokenizer.json`` (None when it has none)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def cut_off_table(
    results: Mapping[str, ConfigResult], max_gen_toks: int, count_tokens: Callable[[str], int] | None
) -> pd.DataFrame:
    """Per finished configuration: answers whose length reached the generation limit.

    lm-eval does not log why generation stopped, so the response is measured: in tokens with the
    model's tokenizer, else in words (a lower bound on tokens: some cut-off answers may be missed).
    """
    measure = count_tokens or (lambda text: len(text.split()))
    how = "tokens (model tokenizer)" if count_tokens else "words (a lower bound)"
    rows = []
    for res in results.values():
        if res.state != "ok":
            continue
        cut = [r for r in res.records if measure(r.response) >= max_gen_toks]
        wrong = sum(not r.correct(_first_filter(r)) for r in cut)
        rows.append(
            {
                "configuration": res.label,
                "answers": len(res.records),
                f"reached {max_gen_toks} {how}": len(cut),
                "of these scored wrong": wrong,
            }
        )
    return pd.DataFrame(rows)


def _first_filter(record: Any) -> str:
    return "strict-match" if hasattr(record, "strict_correct") else "answer-line"


# --------------------------------------------------------------------------- retrieval


def retrieval_accuracy(results: Mapping[str, ConfigResult], filter_name: str, by_kind: bool = False) -> pd.DataFrame:
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
            row: dict[str, Any] = {
                "configuration": res.label,
                **({"kind": kind} if by_kind else {}),
                "context length (tokens)": length,
                "items": len(items),
                "contexts": len({r.context_id for r in items}),
                "correct": int(sum(right)),
                "accuracy %": _pts(sum(right) / len(items)),
            }
            try:
                m = paired.clustered_mean(right, [r.context_id for r in items])
                row.update(
                    {
                        "clustered 95% %": f"{100 * (max(0.0, m.ci_low)):.1f} to {100 * (min(1.0, m.ci_high)):.1f}"
                        if m.se_clustered > 0
                        else NO_VARIATION,
                        "design effect": round(m.design_effect, 2) if m.se_independent else None,
                    }
                )
            except StudyError:  # fewer than two contexts at this length
                row.update({"clustered 95% %": None, "design effect": None})
            low, high = wilson_interval(int(sum(right)), len(items))
            row["Wilson 95% % (ignores clusters)"] = f"{100 * low:.1f} to {100 * high:.1f}"
            rows.append(row)
    return pd.DataFrame(rows)


def retrieval_paired(
    results: Mapping[str, ConfigResult], baseline: str, filter_name: str, margin_points: float
) -> pd.DataFrame:
    """Each finished configuration against the baseline, per context length and overall: the
    discordant items, exact McNemar p, the difference with its clustered 95 % interval, and
    non-inferiority at ``margin_points`` judged on that interval (its lower limit above -margin)."""
    base = results[baseline]
    rows = []
    for res in _candidates(results, baseline):
        lengths: list[int | None] = [*sorted({r.target_tokens for r in base.records}), None]
        for length in lengths:
            keep = [r for r in base.records if length is None or r.target_tokens == length]
            ids = {r.doc_id for r in keep}
            b, c = _by_item(base, filter_name, ids), _by_item(res, filter_name, ids)
            counts = paired.paired_counts(b, c, f"{res.label} vs {base.label}")
            cl = paired.clustered_difference(b, c, {r.doc_id: r.context_id for r in keep})
            rows.append(
                {
                    "configuration": res.label,
                    "role": CONTROL_PREFIX if is_control(res.name) else "candidate",
                    "context length (tokens)": "all" if length is None else length,
                    "items": counts.n,
                    "contexts": cl.clusters,
                    f"only {base.label} right": counts.baseline_only,
                    "only this right": counts.candidate_only,
                    "exact McNemar p": _p(paired.mcnemar_exact(counts.baseline_only, counts.candidate_only)),
                    "difference (points)": round(100 * cl.mean, 1),
                    "clustered 95% (points)": _range(cl.ci_low, cl.ci_high) if cl.se_clustered > 0 else NO_VARIATION,
                    f"non-inferior at {margin_points:g} points": paired.non_inferior(cl.ci_low, margin_points / 100)
                    if cl.se_clustered > 0
                    else "not judged (no variation)",
                    "SE independent / clustered (points)": f"{100 * cl.se_independent:.2f} / "
                    f"{100 * cl.se_clustered:.2f}",
                }
            )
    return pd.DataFrame(rows)


def poisson_binomial_sf(right: int, chances: Sequence[float]) -> float:
    """P(at least ``right`` successes) among independent trials with these chances (exact, scipy's
    Poisson-binomial distribution)."""
    from scipy.stats import poisson_binom

    return float(min(1.0, poisson_binom.sf(right - 1, list(chances)))) if right > 0 else 1.0


def chance_check(result: ConfigResult, filter_name: str, alpha: float = 0.05) -> tuple[bool, str]:
    """Does the model retrieve better than picking one of the context's values at random?

    Item ``i`` is right by such a pick with chance ``1 / n_keys_i`` (the keys in its context), each
    pick independent, so the number right by chance is Poisson-binomial; the one-sided exact test
    compares the model's count with it (its false-claim rate under that null is at most ``alpha``).
    """
    records = result.records
    n, right = len(records), sum(r.correct(filter_name) for r in records)
    if n == 0:
        return False, f"{result.label}: no retrieval records."
    chances = [1.0 / max(1, r.n_keys) for r in records]
    p = poisson_binomial_sf(right, chances)
    ok = p < alpha
    verb = "retrieves better than chance" if ok else "does NOT retrieve better than chance"
    return ok, (
        f"{result.label} {verb}: {right}/{n} right against {sum(chances):.1f} expected by picking one of "
        f"each context's values at random ({100 * min(chances):.1f}% to {100 * max(chances):.1f}% an item; "
        f"one-sided exact Poisson-binomial p = {p:.2g})."
    )
