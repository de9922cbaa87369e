"""Tables and verdicts of a KV-precision capture: each candidate arm against its baseline, beside
the A/A floor of the same engine, per bucket (GSM8K-format; retrieval by context length).

Torch-free: notebook 07 renders a bundled capture with the analysis environment alone.
"""

from __future__ import annotations

from typing import Any

from kvstudy.errors import StudyError
from kvstudy.formats import millinats, p_value
from kvstudy.precision.divergence import MARGIN_STATES, equivalence
from kvstudy.precision.paired_logp import ALPHA, floor_verdict, pair_rows, verdict
from kvstudy.precision.prompts import bucket_length
from kvstudy.precision.records import Capture, Group
from kvstudy.stats.binary import mcnemar_exact, paired_counts
from kvstudy.stats.family import holm

FLOOR_ROLE = "A/A floor"


def _bucket_order(bucket: str) -> tuple[int, int]:
    length = bucket_length(bucket)
    return (0, 0) if length is None else (1, length)


def _arm_label(group: Group, arm: str) -> str:
    info = group.arms.get(arm) or {}
    return str(info.get("label") or arm)


def comparisons(
    capture: Capture, alpha: float = ALPHA, margin_kl: float | None = None, margin_delta: float | None = None
) -> list[dict[str, Any]]:
    """One record per group, bucket and arm (the floor first): Δ log p and its test, the KL from the
    top-k (its keys absent without one), equivalence against the margins (None: undecided) and the verdict; the candidates' p are
    one Holm family (``p_holm``) before any verdict reads them.
    """
    out: list[dict[str, Any]] = []
    for group in capture.groups:
        for bucket in sorted({str(r["bucket"]) for r in capture.logp[(group.name, group.baseline)]}, key=_bucket_order):
            arms = (group.baseline, group.floor, *group.candidates)
            rows = {arm: [r for r in capture.logp[(group.name, arm)] if r["bucket"] == bucket] for arm in arms}
            floor = pair_rows(rows[group.baseline], rows[group.floor], alpha)
            for role, arm in [(FLOOR_ROLE, group.floor)] + [("candidate", c) for c in group.candidates]:
                paired = floor if arm == group.floor else pair_rows(rows[group.baseline], rows[arm], alpha)
                t, kl, tost = paired.test, paired.kl, paired.tost
                out.append(
                    {
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
                        **(
                            {}  # no top-k in the rows: no KL keys
                            if kl is None
                            else {
                                "kl": kl.mean,
                                "kl_low": kl.low,
                                "kl_high": kl.high,
                                "kl_rest": kl.rest,
                                "equivalence_kl": equivalence(kl.low, kl.high, margin_kl).state,
                            }
                        ),
                    }
                )
    _holm(out, alpha)
    return out


def _holm(records: list[dict[str, Any]], alpha: float) -> None:
    """Holm-adjust the candidates' p over the whole report (one family), then word each verdict."""
    family = [r for r in records if r["role"] != FLOOR_ROLE and r["p"] == r["p"]]
    for r, p in zip(family, holm([r["p"] for r in family])):
        r["p_holm"] = p
    for r in records:
        r.setdefault("p_holm", r["p"] if r["role"] == FLOOR_ROLE else float("nan"))
        r["family"] = len(family)
        r["verdict"] = (
            floor_verdict(r["p"], alpha)
            if r["role"] == FLOOR_ROLE
            else verdict(r["p_holm"], r["mean"], r["floor_p"], alpha, label=f"Holm p over {len(family)}")
        )


def comparison_table(records: list[dict[str, Any]], shown: bool = True) -> Any:
    """The report table of :func:`comparisons`: numbers formatted for reading (``shown``: Δ log p in
    millinats, p as ``< 0.001`` below 0.001), or the full values for its CSV (Δ log p in nats)."""
    import pandas as pd

    def delta(value: float | None) -> Any:
        return millinats(value, 3, sign=False) if shown else value

    rows = [
        {
            "model": r["group"],
            "bucket": r["bucket"],
            "arm": r["label"],
            "role": r["role"],
            "prompts": r["prompts"],
            "tokens": r["tokens"],
            **(
                {
                    "mean Δ log p (millinats/token)": delta(r["mean"]),
                    "clustered 95% (millinats/token)": f"{delta(r['low'])} to {delta(r['high'])}",
                }
                if shown
                else {
                    "mean Δ log p (nats/token)": r["mean"],
                    "low 95% (nats/token)": r["low"],
                    "high 95% (nats/token)": r["high"],
                }
            ),
            "p": p_value(r["p"]) if shown else r["p"],
            "p, Holm over the report's candidates": p_value(r.get("p_holm")) if shown else r.get("p_holm"),
            **_kl_columns(r, shown),
            "top-1 agreement %": ("–" if r["top1"] is None else f"{100 * r['top1']:.2f}")
            if shown
            else (None if r["top1"] is None else 100 * r["top1"]),
            "A/A floor p": p_value(r["floor_p"]) if shown else r["floor_p"],
            "verdict": r["verdict"],
            "storage": r["engine"],
        }
        for r in records
    ]
    return pd.DataFrame(rows)


def _kl_columns(r: dict[str, Any], shown: bool) -> dict[str, Any]:
    """The KL columns (from the top-k; absent in a capture without it)."""
    if r.get("kl") is None:
        return {}
    if not shown:
        return {
            "KL lower bound (nats/token)": r["kl"],
            "KL one-sided 95% low (nats/token)": r["kl_low"],
            "KL + truncation one-sided 95% high (nats/token)": r["kl_high"],
            "mass outside the compared top-k": r["kl_rest"],
            "equivalence (KL)": r["equivalence_kl"],
        }
    return {
        "KL (millinats/token)": millinats(r["kl"], 3, sign=False),
        "KL one-sided 95% (millinats/token)": f"{millinats(r['kl_low'], 3, sign=False)} to "
        f"{millinats(r['kl_high'], 3, sign=False)}",
        "mass outside top-k %": f"{100 * r['kl_rest']:.2f}",
        "equivalence (KL)": r["equivalence_kl"],
    }


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
            p = mcnemar_exact(b, c).p_value
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
    reason = state.reason
    if state.state != "undecided" and margin_kl is not None and floor.kl.high >= margin_kl:
        state, reason = equivalence(float("nan"), float("nan"), margin_kl), "the A/A floor alone reaches the margin"
    simulated = group.engine.startswith("simulated")
    return {
        "equivalence": state.state,
        "equivalence_reason": reason,
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
        "simulated": simulated,
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
