"""Paired statistics of teacher-forced log-probabilities, and the tables and verdicts of a
KV-precision capture: each candidate arm against its baseline, beside the A/A floor of the same
engine, per bucket (GSM8K-format; retrieval by context length).

Each arm scores the same prompts' reference tokens. Per token, ``Δ = log p(candidate) - log
p(baseline)``; tokens of one prompt (or one shared context) are a cluster, so the mean Δ gets a
cluster-robust standard error (:func:`kvstudy.stats.binary.clustered_mean`). Top-1 agreement is
the share of reference positions where both arms' most likely next token is the same. Greedy
answers are compared by exact McNemar (:func:`kvstudy.stats.binary.mcnemar_exact`).

A loss is claimed only when the candidate's test rejects at ``alpha`` with a negative Δ **and**
the A/A floor (16-bit against 16-bit of the same engine) does not reject; otherwise "no claim"
with the reason. Torch-free: notebook 07 renders a bundled capture with the analysis environment alone.

**KL over a truncated top-k.** Tokens listed by both arms (16-bit P, candidate Q) are compared one
by one; the rest is lumped into one bucket. The KL of these coarse distributions
(:attr:`TokenKL.kl`) is a **lower bound** of KL(P || Q) (the log-sum inequality); what it leaves out,
``p_rest · KL(P_rest || Q_rest)``, is at most ``p_rest · (L - log(p_rest / q_rest))`` with L the
largest log ratio inside the tail. The tail is not returned, so :attr:`TokenKL.gap` takes L as the
largest absolute log ratio on the compared tokens (an **assumption**, stated in every report);
``kl + gap`` is the upper value equivalence uses. A rest below ``REST_FLOOR`` counts as it.

**Equivalence.** A mean's one-sided (1 - alpha) bounds against a margin: *within* (upper below),
*beyond* (lower above), *undecided* otherwise.

**Calibration.** A ladder of control grades (keys ``factor`` times larger, FP8 KV at scale 1.0):
the grades must rank in order on every instrument (beyond the noise), and the first grade whose
accuracy is shown to fall by ``loss_points`` gives the margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstudy.bench.logprobs import Capture, Group
from kvstudy.errors import StudyError
from kvstudy.formats import millinats, p_text, p_value
from kvstudy.stats.binary import ALPHA, ClusteredMean, clustered_mean, holm, mcnemar_exact, paired_counts

REST_FLOOR = 1e-7  # the smallest rest mass counted (float32 resolves no finer near 1)
LOSS_POINTS = 2.0  # the accuracy loss (points) the margin is calibrated to
MARGIN_STATES = ("calibrated", "not calibrated", "assumed")


@dataclass(frozen=True)
class TokenKL:
    """KL(P || Q) at one position from two truncated top-k lists."""

    kl: float  # the lumped KL: a lower bound of the full KL
    gap: float  # the bound on what the lumping leaves out (under the stated tail assumption)
    rest: float  # P's mass outside the compared tokens


def _probabilities(logps: Mapping[int, float], where: str) -> dict[int, float]:
    out = {}
    for token, value in logps.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or value > 1e-3:
            raise StudyError(f"{where}: token {token}: log p {value!r} is not a log-probability (a number <= 0)")
        out[token] = math.exp(max(float(value), -1e4))
    return out


def token_kl(p_top: Mapping[int, float], q_top: Mapping[int, float], where: str = "top-k") -> TokenKL:
    """KL(P || Q) with the mass outside the tokens listed by both arms in one "rest" bucket."""
    if not p_top or not q_top:
        raise StudyError(f"{where}: no top-k log-probabilities in one of the arms")
    p, q = _probabilities(p_top, where + " (baseline)"), _probabilities(q_top, where + " (candidate)")
    both = sorted(set(p) & set(q))
    pi = np.array([p[t] for t in both])
    qi = np.array([q[t] for t in both])
    p_rest = max(0.0, 1.0 - float(pi.sum()))
    q_rest = max(0.0, 1.0 - float(qi.sum()))
    # the coarse distributions, renormalised (float32 rounding can make the listed mass exceed 1)
    pv = np.append(pi, p_rest)
    qv = np.append(qi, max(q_rest, REST_FLOOR if p_rest > 0 else 0.0))
    pv, qv = pv / pv.sum(), qv / qv.sum()
    keep = pv > 0
    kl = float(max(0.0, np.sum(pv[keep] * (np.log(pv[keep]) - np.log(qv[keep])))))
    ratios = np.abs(np.log(pi) - np.log(qi)) if both else np.array([0.0])
    gap = 0.0
    if pv[-1] > 0:
        gap = float(max(0.0, pv[-1] * (float(ratios.max()) - math.log(pv[-1] / qv[-1]))))
    return TokenKL(kl, gap, float(pv[-1]))


# --------------------------------------------------------------------------- equivalence


@dataclass(frozen=True)
class Equivalence:
    """The TOST verdict of one mean against a margin."""

    state: str  # "within" (the upper bound below the margin), "beyond" (the lower above) or "undecided"
    reason: str


def equivalence(low: float, high: float, margin: float | None, two_sided: bool = False) -> Equivalence:
    """*within* / *beyond* / *undecided* for a mean whose one-sided (1 - alpha) bounds are ``low`` and
    ``high`` (i.e. its 1 - 2 alpha interval). ``two_sided``: the margin is ±margin (a difference such
    as Δ log p); else a non-negative quantity (a divergence) against ``margin``."""
    if margin is None or not math.isfinite(margin) or margin <= 0:
        return Equivalence("undecided", "no margin to test against")
    if not (math.isfinite(low) and math.isfinite(high)):
        return Equivalence("undecided", "no interval (fewer than two clusters)")
    inside = (-margin < low and high < margin) if two_sided else high < margin
    outside = (high < -margin or low > margin) if two_sided else low > margin
    state, where = (
        ("within", "lies inside") if inside else ("beyond", "lies past") if outside else ("undecided", "straddles")
    )
    return Equivalence(state, f"the interval {low:.3g} to {high:.3g} {where} the margin")


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Grade:
    """One grade of the control ladder: its accuracy change (candidate minus 16-bit, points, with a
    95 % interval) and the screen's mean KL and Δ log p on it."""

    factor: float
    change_points: float
    change_low: float
    change_high: float
    kl: float
    delta_logp: float
    bf16_change_points: float = 0.0  # the grade served with 16-bit KV against the original (~0; nan: not run)
    kl_low: float = math.nan  # the one-sided (1 - alpha) bounds of the mean KL and Δ log p (nan: none)
    kl_high: float = math.nan
    delta_logp_low: float = math.nan
    delta_logp_high: float = math.nan
    top1: float = math.nan  # share of reference positions whose most likely token is unchanged


@dataclass(frozen=True)
class Calibration:
    """The margin read off a ladder, or why there is none."""

    state: str  # "calibrated" or "not calibrated"
    ranked: dict[str, bool]  # instrument -> the grades rank in order on it (no reversal beyond the noise)
    reason: str
    margin_kl: float | None = None
    margin_delta_logp: float | None = None  # a magnitude, nats/token
    grade: float | None = None  # the factor at which accuracy first fell by loss_points
    change_points: float | None = None
    change_low: float | None = None
    change_high: float | None = None
    margin_kl_high: float | None = None  # the KL's upper one-sided bound at that grade
    below: float | None = None  # the largest factor below it (its accuracy change did not reach the loss)
    below_kl: float | None = None  # that grade's KL: the 2-point loss lies between below_kl and margin_kl


# instrument -> the Grade fields of its value and its bounds, and whether it rises with the factor
INSTRUMENTS = {
    "KL": ("kl", "kl_low", "kl_high", True),
    "Δ log p": ("delta_logp", "delta_logp_low", "delta_logp_high", False),
    "accuracy": ("change_points", "change_low", "change_high", False),
}


def ranked(grades: Sequence[Grade], instruments: Sequence[str] = tuple(INSTRUMENTS)) -> dict[str, bool]:
    """Per instrument, whether no larger grade is better than a smaller one beyond the noise: a reversal
    counts when the two grades' intervals do not overlap (without intervals, nan: any reversal counts)."""
    ladder = sorted(grades, key=lambda g: g.factor)
    out = {}
    for name in instruments:
        *fields, rises = INSTRUMENTS[name]
        value, low, high = ([float(getattr(g, f)) for g in ladder] for f in fields)
        if not rises:  # the same test on the negated values, whose bounds swap
            value, low, high = [-v for v in value], [-h for h in high], [-lo for lo in low]
        out[name] = all(
            not b < a or (math.isfinite(hi_b) and math.isfinite(lo_a) and hi_b >= lo_a)
            for a, b, lo_a, hi_b in zip(value, value[1:], low, high[1:])
        )
    return out


def calibrate(grades: Sequence[Grade], loss_points: float = LOSS_POINTS) -> Calibration:
    """The KL and Δ log p margin at the first grade whose accuracy is shown to fall by ``loss_points``
    or more (its 95 % interval wholly below ``-loss_points``: a point estimate alone would let the
    noise of a few hundred questions set the margin; the grade below brackets where the loss begins).

    Refused: fewer than two grades, a factor given twice, or a grade that already loses
    ``loss_points`` at 16-bit KV (the checkpoint is broken, not the FP8 storage). "not calibrated":
    an instrument does not rank the grades in order, or no grade is shown to reach the loss."""
    if len(grades) < 2:
        raise StudyError(f"control ladder: {len(grades)} grade(s); expected at least two factors")
    ladder = sorted(grades, key=lambda g: g.factor)
    if len({g.factor for g in ladder}) != len(ladder):
        raise StudyError("control ladder: a factor appears twice; expected one grade per factor")
    for g in ladder:
        for name in ("factor", "change_points", "change_low", "change_high", "kl", "delta_logp"):
            if not math.isfinite(getattr(g, name)):
                raise StudyError(f"control ladder: grade {g.factor:g}: {name} is not a finite number")
    broken = next((g for g in ladder if g.bf16_change_points <= -loss_points), None)  # nan: not run
    if broken is not None:
        raise StudyError(
            f"control ladder: grade {broken.factor:g} already loses {-broken.bf16_change_points:.1f} points "
            "with 16-bit KV: the checkpoint is broken, not the FP8 storage; expected every grade to match 16-bit"
        )
    ranks = ranked(ladder)
    reached = next((g for g in ladder if g.change_high < -loss_points), None)
    unranked = ", ".join(name for name, ok in ranks.items() if not ok)
    if unranked or reached is None:
        why = (
            f"the grades are out of order on: {unranked}"
            if unranked
            else f"no grade is shown to lose {loss_points:g} points (the largest factor {ladder[-1].factor:g} "
            f"changes accuracy by {ladder[-1].change_points:+.1f} points)"
        )
        return Calibration("not calibrated", ranks, why)
    below = ladder[ladder.index(reached) - 1] if ladder.index(reached) > 0 else None
    return Calibration(
        "calibrated",
        ranks,
        f"factor {reached.factor:g} is the first grade shown to lose {loss_points:g} points or more "
        f"({reached.change_points:+.1f}, 95 % {reached.change_low:+.1f} to {reached.change_high:+.1f})",
        reached.kl,
        abs(reached.delta_logp),
        reached.factor,
        reached.change_points,
        reached.change_low,
        reached.change_high,
        reached.kl_high if math.isfinite(reached.kl_high) else None,
        below.factor if below else None,
        below.kl if below else None,
    )


# --------------------------------------------------------------------------- paired log p


@dataclass(frozen=True)
class PairedKL:
    """KL(baseline || candidate) per reference token from the top-k (``divergence.token_kl``): the
    clustered mean of the lumped KL (a lower bound), its one-sided (1 - alpha) lower bound, and the
    one-sided upper bound of the mean of KL + the truncation bound (the value equivalence uses)."""

    mean: float
    low: float
    high: float
    gap: float  # mean truncation bound (under the tail assumption above)
    rest: float  # mean baseline mass outside the compared tokens


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
    gap, rest = (float(np.mean([getattr(k, name) for k in kls])) for name in ("gap", "rest"))
    return PairedKL(lower.mean, lower.ci_low, upper.ci_high, gap, rest)


def bucket_length(bucket: str) -> int | None:
    """The context length of a retrieval bucket (None for other buckets)."""
    head, _, tail = bucket.partition(" ")
    return int(tail) if head == "retrieval" and tail.isdigit() else None


def _index(rows: Sequence[Mapping[str, Any]], what: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if str(row["id"]) in out:
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


FLOOR_ROLE = "A/A floor"


def _arm_label(group: Group, arm: str) -> str:
    return str((group.arms.get(arm) or {}).get("label") or arm)


def comparisons(
    capture: Capture, alpha: float = ALPHA, margin_kl: float | None = None, margin_delta: float | None = None
) -> list[dict[str, Any]]:
    """One record per group, bucket and arm (the floor first): Δ log p and its test, the KL from the
    top-k (its keys absent without one), equivalence against the margins (None: undecided) and the verdict; the candidates' p are
    one Holm family (``p_holm``) before any verdict reads them.
    """
    out: list[dict[str, Any]] = []
    for group in capture.groups:
        buckets = {str(r["bucket"]) for r in capture.logp[(group.name, group.baseline)]}
        for bucket in sorted(buckets, key=lambda b: (bucket_length(b) is not None, bucket_length(b) or 0)):
            arms = (group.baseline, group.floor, *group.candidates)
            rows = {arm: [r for r in capture.logp[(group.name, arm)] if r["bucket"] == bucket] for arm in arms}
            floor = pair_rows(rows[group.baseline], rows[group.floor], alpha)
            for role, arm in [(FLOOR_ROLE, group.floor)] + [("candidate", c) for c in group.candidates]:
                paired = floor if arm == group.floor else pair_rows(rows[group.baseline], rows[arm], alpha)
                t, kl, tost = paired.test, paired.kl, paired.tost
                record = {
                    "group": group.name,
                    "engine": group.engine,
                    "bucket": bucket,
                    "role": role,
                    "arm": arm,
                    "label": _arm_label(group, arm),
                    "prompts": paired.prompts,
                    "tokens": t.n,
                    "mean": t.mean,
                    "low": t.ci_low,
                    "high": t.ci_high,
                    "p": t.p_value,
                    "top1": paired.top1_agreement,
                    "floor_p": floor.test.p_value,
                    "equivalence_delta": equivalence(tost.ci_low, tost.ci_high, margin_delta, two_sided=True).state,
                }
                if kl is not None:  # no top-k in the rows: no KL keys
                    same = equivalence(kl.low, kl.high, margin_kl).state
                    record |= dict(kl=kl.mean, kl_low=kl.low, kl_high=kl.high, kl_rest=kl.rest, equivalence_kl=same)
                out.append(record)
    family = [r for r in out if r["role"] != FLOOR_ROLE and r["p"] == r["p"]]  # p NaN: no test
    for r, p in zip(family, holm([r["p"] for r in family])):
        r["p_holm"] = p
    for r in out:
        r.setdefault("p_holm", r["p"] if r["role"] == FLOOR_ROLE else float("nan"))
        r["family"] = len(family)
        r["verdict"] = (
            floor_verdict(r["p"], alpha)
            if r["role"] == FLOOR_ROLE
            else verdict(r["p_holm"], r["mean"], r["floor_p"], alpha, label=f"Holm p over {len(family)}")
        )
    return out


def comparison_table(records: list[dict[str, Any]], shown: bool = True) -> Any:
    """The report table of :func:`comparisons`: numbers formatted for reading (``shown``: Δ log p in
    millinats, p as ``< 0.001`` below 0.001), or the full values for its CSV (Δ log p in nats)."""
    import pandas as pd

    def mn(value: float) -> str:
        return millinats(value, 3, sign=False)

    def p(value: float | None) -> Any:
        return p_value(value) if shown else value

    rows = []
    for r in records:
        row = {"model": r["group"], "bucket": r["bucket"], "arm": r["label"], "role": r["role"]}
        row |= {"prompts": r["prompts"], "tokens": r["tokens"]}
        if shown:
            row["mean Δ log p (millinats/token)"] = mn(r["mean"])
            row["clustered 95% (millinats/token)"] = f"{mn(r['low'])} to {mn(r['high'])}"
        else:
            row |= {
                "mean Δ log p (nats/token)": r["mean"],
                "low 95% (nats/token)": r["low"],
                "high 95% (nats/token)": r["high"],
            }
        row |= {"p": p(r["p"]), "p, Holm over the report's candidates": p(r.get("p_holm"))}
        if r.get("kl") is not None and shown:  # the KL columns: from the top-k, absent in a capture without it
            row["KL (millinats/token)"] = mn(r["kl"])
            row["KL one-sided 95% (millinats/token)"] = f"{mn(r['kl_low'])} to {mn(r['kl_high'])}"
            row["mass outside top-k %"] = f"{100 * r['kl_rest']:.2f}"
        elif r.get("kl") is not None:
            row["KL lower bound (nats/token)"] = r["kl"]
            row["KL one-sided 95% low (nats/token)"] = r["kl_low"]
            row["KL + truncation one-sided 95% high (nats/token)"] = r["kl_high"]
            row["mass outside the compared top-k"] = r["kl_rest"]
        if r.get("kl") is not None:
            row["equivalence (KL)"] = r["equivalence_kl"]
        top1 = None if r["top1"] is None else 100 * r["top1"]
        row["top-1 agreement %"] = ("–" if top1 is None else f"{top1:.2f}") if shown else top1
        rows.append(row | {"A/A floor p": p(r["floor_p"]), "verdict": r["verdict"], "storage": r["engine"]})
    return pd.DataFrame(rows)


def greedy_records(capture: Capture, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Greedy GSM8K-format accuracy per arm, paired per item with the baseline (exact McNemar)."""
    out: list[dict[str, Any]] = []
    for group in capture.groups:
        base = capture.greedy.get((group.name, group.baseline))
        if not base:
            continue
        by_id = {r["id"]: bool(r["correct"]) for r in base}
        floor_p = float("nan")  # the floor comes first: its p is known before any candidate's verdict
        for role, arm in [(FLOOR_ROLE, group.floor)] + [("candidate", c) for c in group.candidates]:
            rows = capture.greedy.get((group.name, arm))
            if not rows:
                continue
            cand = {r["id"]: bool(r["correct"]) for r in rows if r["id"] in by_id}
            counts = paired_counts({i: by_id[i] for i in cand}, cand, f"{group.name}/{arm} greedy")
            b, c = counts.baseline_only, counts.candidate_only
            p = mcnemar_exact(b, c)
            floor_p = p if role == FLOOR_ROLE else floor_p
            out.append(
                {
                    "model": group.name,
                    "arm": _arm_label(group, arm),
                    "role": role,
                    "items": counts.n,
                    "baseline right": counts.baseline_correct,
                    "this right": counts.candidate_correct,
                    "only baseline right": b,
                    "only this right": c,
                    "exact McNemar p": p,
                    "verdict": floor_verdict(p, alpha)
                    if role == FLOOR_ROLE
                    else verdict(p, float(c - b), floor_p, alpha),
                    "storage": group.engine,
                }
            )
    return out


def greedy_table(records: list[dict[str, Any]], shown: bool = True) -> Any:
    """The greedy accuracy table; ``shown``: p as a reader reads it, else the full values (its CSV)."""
    import pandas as pd

    frame = pd.DataFrame(records)
    if shown and len(frame):
        frame["exact McNemar p"] = [p_value(p) for p in frame["exact McNemar p"]]
    return frame


def find(records: list[dict[str, Any]], group: str, arm: str, bucket: str | None = None) -> dict[str, Any] | None:
    """The record of ``arm`` in ``group`` (and ``bucket``), or None."""
    return next((r for r in records if r["group"] == group and r["arm"] == arm and bucket in (None, r["bucket"])), None)


def claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidate records whose verdict claims a loss."""
    return [r for r in records if r["role"] == "candidate" and str(r["verdict"]).startswith("loss")]


def floor_rejections(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The A/A floor records that reject (they forbid every claim in their bucket)."""
    return [r for r in records if r["role"] == FLOOR_ROLE and r["p"] < ALPHA]


def screen_facts(
    capture: Capture,
    margin_kl: float | None,
    margin_state: str,
    candidate: str | None = None,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """The engine screen's verdict over every bucket of the first group: the candidate's KL (lower
    bound, and the one-sided upper bound with the truncation bound) against ``margin_kl``, beside the
    A/A floor's; top-1 agreement; Δ log p. ``margin_state``: calibrated, not calibrated or assumed.
    The equivalence is *undecided* when there is no margin, or when the floor alone reaches it."""
    if margin_state not in MARGIN_STATES:
        raise StudyError(f"margin_state: {margin_state!r}; expected one of {', '.join(MARGIN_STATES)}")
    group = capture.groups[0]
    arm = candidate or group.candidates[0]
    base = capture.logp[(group.name, group.baseline)]
    cand = pair_rows(base, capture.logp[(group.name, arm)], alpha)
    floor = pair_rows(base, capture.logp[(group.name, group.floor)], alpha)
    if cand.kl is None or floor.kl is None:
        raise StudyError(f"{capture.folder}: the capture holds no top-k log-probabilities (kv-screen --top-k)")
    state = equivalence(cand.kl.low, cand.kl.high, margin_kl)
    if state.state != "undecided" and margin_kl is not None and floor.kl.high >= margin_kl:
        state = Equivalence("undecided", "the A/A floor alone reaches the margin")
    return {
        "equivalence": state.state,
        "equivalence_reason": state.reason,
        "margin_kl": margin_kl,
        "margin_state": margin_state,
        "kl_mean": cand.kl.mean,
        "kl_low": cand.kl.low,
        "kl_upper": cand.kl.high,
        "kl_rest": cand.kl.rest,
        "floor_kl_mean": floor.kl.mean,
        "floor_kl_upper": floor.kl.high,
        "top1_agreement": cand.top1_agreement,
        "floor_top1_agreement": floor.top1_agreement,
        "delta_logp_mean": cand.test.mean,
        "delta_logp_low": cand.test.ci_low,
        "delta_logp_high": cand.test.ci_high,
        "tokens": cand.test.n,
        "prompts": cand.prompts,
        "candidate": _arm_label(group, arm),
        "engine": group.engine,
        "simulated": group.engine.startswith("simulated"),
    }


def screen_sentence(facts: dict[str, Any]) -> str:
    """The engine screen's verdict in words (KL in millinats per token)."""

    def mn(value: float | None) -> str:
        return millinats(value, 3, sign=False)

    head = (
        f"{facts['candidate']} against 16-bit ({'simulated storage' if facts['simulated'] else 'the engine itself'}; "
        f"{facts['tokens']:,} reference tokens of {facts['prompts']} prompts): KL(16-bit || {facts['candidate']}) "
        f"{mn(facts['kl_mean'])} millinats/token (one-sided 95 % bounds {mn(facts['kl_low'])} to "
        f"{mn(facts['kl_upper'])}, the upper one with the top-k truncation bound), A/A floor {mn(facts['floor_kl_mean'])} "
        f"(upper {mn(facts['floor_kl_upper'])}); top-1 agreement "
        + ("–" if facts["top1_agreement"] is None else f"{100 * facts['top1_agreement']:.2f} %")
        + f"; mean Δ log p {millinats(facts['delta_logp_mean'], 3)} millinats/token."
    )
    margin = facts["margin_kl"]
    if margin is None:
        tail = (
            f" No KL margin ({facts['margin_state']}): the equivalence verdict is undecided and the screen rests on "
            "the KL, the A/A floor and top-1 agreement alone, not on a loss in accuracy points."
        )
    else:
        tail = (
            f" Against the {facts['margin_state']} margin of {mn(margin)} millinats/token: **{facts['equivalence']}** "
            f"({facts['equivalence_reason']})."
        )
    return head + tail
