"""Paired statistics of teacher-forced log-probabilities, and the verdicts drawn from them.

Each arm scores the same prompts' reference tokens. Per token, ``Δ = log p(candidate) - log
p(baseline)``; tokens of one prompt (or one shared context) are a cluster, so the mean Δ gets a
cluster-robust standard error (:func:`kvstudy.stats.clustered.clustered_mean`). Top-1 agreement is
the share of reference positions where both arms' most likely next token is the same. Greedy
answers are compared by exact McNemar (:func:`kvstudy.stats.binary.mcnemar_exact`).

A loss is claimed only when the candidate's test rejects at ``alpha`` with a negative Δ **and**
the A/A floor (16-bit against 16-bit of the same engine) does not reject; otherwise "no claim"
with the reason. Torch-free: the analysis environment imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstudy.errors import StudyError
from kvstudy.formats import p_text
from kvstudy.precision.divergence import TokenKL, token_kl
from kvstudy.stats.binary import ALPHA
from kvstudy.stats.clustered import ClusteredMean, clustered_mean


@dataclass(frozen=True)
class PairedKL:
    """KL(baseline || candidate) per reference token from the top-k (``divergence.token_kl``): the
    clustered mean of the lumped KL (a lower bound), its one-sided (1 - alpha) lower bound, and the
    one-sided upper bound of the mean of KL + the truncation bound (the value equivalence uses)."""

    mean: float
    low: float
    high: float
    gap: float  # mean truncation bound (under the tail assumption of kvstudy.precision.divergence)
    rest: float  # mean baseline mass outside the compared tokens
    tokens: int
    clusters: int


@dataclass(frozen=True)
class PairedLogp:
    """One candidate arm against the baseline over a set of prompts."""

    test: ClusteredMean
    prompts: int
    top1_agreement: float | None  # share of reference positions with the same top-1 token
    tost: ClusteredMean  # Δ log p with the 1 - 2 alpha interval (the two one-sided tests)
    kl: PairedKL | None = None  # None: the rows hold no top-k


def _paired_kl(kls: list[TokenKL], groups: list[str], alpha: float) -> PairedKL:
    lower = clustered_mean([k.kl for k in kls], groups, 2 * alpha)
    upper = clustered_mean([k.kl + k.gap for k in kls], groups, 2 * alpha)
    return PairedKL(
        lower.mean,
        lower.ci_low,
        upper.ci_high,
        float(np.mean([k.gap for k in kls])),
        float(np.mean([k.rest for k in kls])),
        lower.n,
        lower.clusters,
    )


def _index(rows: Sequence[Mapping[str, Any]], what: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row["id"] in out:
            raise StudyError(f"{what}: prompt {row['id']!r} appears twice")
        out[str(row["id"])] = row
    return out


def pair_rows(
    baseline: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]], alpha: float = ALPHA
) -> PairedLogp:
    """Pair two arms' rows by prompt id and compare their reference tokens' log p."""
    base, cand = _index(baseline, "baseline"), _index(candidate, "candidate")
    missing = sorted(set(base) ^ set(cand))
    if missing:
        raise StudyError(f"paired log p: prompts scored in one arm only: {missing[:5]}")
    deltas: list[float] = []
    groups: list[str] = []
    kls: list[TokenKL] = []
    kl_groups: list[str] = []
    agree = compared = 0
    for pid in sorted(base):
        b, c = base[pid], cand[pid]
        if len(b["logp"]) != len(c["logp"]):
            raise StudyError(
                f"paired log p: prompt {pid!r} has {len(b['logp'])} reference tokens in the baseline and "
                f"{len(c['logp'])} in the candidate (different tokenizers?)"
            )
        deltas += [float(y) - float(x) for x, y in zip(b["logp"], c["logp"])]
        groups += [str(b["cluster"])] * len(b["logp"])
        if b.get("top1") is not None and c.get("top1") is not None:
            agree += sum(1 for x, y in zip(b["top1"], c["top1"]) if x == y)
            compared += len(b["top1"])
        if b.get("topk") is not None and c.get("topk") is not None:
            where = f"paired log p: prompt {pid!r}"
            kls += [token_kl(_top(x, where), _top(y, where), where) for x, y in zip(b["topk"], c["topk"])]
            kl_groups += [str(b["cluster"])] * len(b["topk"])
    test = clustered_mean(deltas, groups, alpha)
    return PairedLogp(
        test=test,
        prompts=len(base),
        top1_agreement=agree / compared if compared else None,
        tost=clustered_mean(deltas, groups, 2 * alpha),
        kl=_paired_kl(kls, kl_groups, alpha) if kls else None,
    )


def _top(pairs: Any, where: str) -> dict[int, float]:
    """A stored top-k position (a list of [token id, log p]) as {id: log p}."""
    try:
        return {int(token): float(value) for token, value in pairs}
    except (TypeError, ValueError):
        raise StudyError(f"{where}: topk: expected a list of [token id, log p] pairs per position") from None


def verdict(candidate_p: float, candidate_mean: float, floor_p: float, alpha: float = ALPHA, label: str = "p") -> str:
    """'loss' only when the candidate's test rejects with Δ < 0 and the A/A floor's does not
    (``label``: what the candidate's p is, e.g. "Holm p" when adjusted over a family)."""

    def named(p: float) -> str:
        return label + p_text(p)[1:]

    if not np.isfinite(candidate_p):
        return "no claim: too few clusters for a test"
    if candidate_p >= alpha:
        return f"no claim: the paired test does not reject ({named(candidate_p)} >= {alpha:g})"
    if floor_p < alpha:  # NaN: no test, no rejection
        return f"no claim: the A/A floor rejects too ({p_text(floor_p)}), so the method cannot tell"
    if candidate_mean > 0:
        return f"no claim of a loss: the candidate scores higher ({named(candidate_p)})"
    return f"loss ({named(candidate_p)}; A/A floor {p_text(floor_p)})"


def floor_verdict(floor_p: float, alpha: float = ALPHA) -> str:
    """What the A/A floor itself says (it should make no claim)."""
    if floor_p < alpha:
        return f"the A/A floor rejects ({p_text(floor_p)}): noise alone 'differs'; no claim is possible"
    return "no claim (A/A floor)"
