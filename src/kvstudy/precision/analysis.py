"""Tables and verdicts of a KV-precision capture: each candidate arm against its baseline, beside
the A/A floor of the same engine, per bucket (GSM8K-format; retrieval by context length).

Torch-free: notebook 07 renders a bundled capture with the analysis environment alone.
"""

from __future__ import annotations

from typing import Any

from kvstudy.formats import millinats, p_value
from kvstudy.precision.paired_logp import ALPHA, floor_verdict, pair_rows, verdict
from kvstudy.precision.prompts import bucket_length
from kvstudy.precision.records import Capture, Group
from kvstudy.stats.binary import mcnemar_exact

FLOOR_ROLE = "A/A floor"


def _bucket_order(bucket: str) -> tuple[int, int]:
    length = bucket_length(bucket)
    return (0, 0) if length is None else (1, length)


def _arm_label(group: Group, arm: str) -> str:
    info = group.arms.get(arm) or {}
    return str(info.get("label") or arm)


def comparisons(capture: Capture, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """One record per group, bucket and arm (the floor first): Δ log p, its test and the verdict."""
    out: list[dict[str, Any]] = []
    for group in capture.groups:
        base_rows = capture.logp[(group.name, group.baseline)]
        buckets = sorted({str(r["bucket"]) for r in base_rows}, key=_bucket_order)
        for bucket in buckets:

            def rows(arm: str, bucket: str = bucket, name: str = group.name) -> list[dict[str, Any]]:
                return [r for r in capture.logp[(name, arm)] if r["bucket"] == bucket]

            floor = pair_rows(rows(group.baseline), rows(group.floor), alpha)
            for role, arm in [(FLOOR_ROLE, group.floor)] + [("candidate", c) for c in group.candidates]:
                paired = floor if arm == group.floor else pair_rows(rows(group.baseline), rows(arm), alpha)
                t = paired.test
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
                        "max_abs": paired.max_abs_delta,
                        "floor_p": floor.test.p_value,
                        "verdict": floor_verdict(t.p_value, alpha)
                        if role == FLOOR_ROLE
                        else verdict(t.p_value, t.mean, floor.test.p_value, alpha),
                    }
                )
    return out


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


def greedy_records(capture: Capture, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Greedy GSM8K-format accuracy per arm, paired per item with the baseline (exact McNemar)."""
    out: list[dict[str, Any]] = []
    for group in capture.groups:
        base = capture.greedy.get((group.name, group.baseline))
        if not base:
            continue
        by_id = {r["id"]: bool(r["correct"]) for r in base}
        arms = [(FLOOR_ROLE, group.floor)] + [("candidate", c) for c in group.candidates]
        tests = {}
        for role, arm in arms:
            rows = capture.greedy.get((group.name, arm))
            if not rows:
                continue
            ids = [r["id"] for r in rows if r["id"] in by_id]
            cand = {r["id"]: bool(r["correct"]) for r in rows}
            b = sum(by_id[i] and not cand[i] for i in ids)
            c = sum(cand[i] and not by_id[i] for i in ids)
            p = mcnemar_exact(b, c).p_value
            tests[arm] = (role, ids, b, c, p, sum(cand[i] for i in ids))
        floor_p = tests[group.floor][4] if group.floor in tests else float("nan")
        for arm, (role, ids, b, c, p, right) in tests.items():
            out.append(
                {
                    "group": group.name,
                    "arm": _arm_label(group, arm),
                    "role": role,
                    "items": len(ids),
                    "baseline right": sum(by_id[i] for i in ids),
                    "this right": right,
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
    if len(frame):
        if shown:
            frame["exact McNemar p"] = [p_value(p) for p in frame["exact McNemar p"]]
        frame = frame.rename(columns={"group": "model"})
    return frame


def find(records: list[dict[str, Any]], group: str, arm: str, bucket: str | None = None) -> dict[str, Any] | None:
    """The record of ``arm`` in ``group`` (and ``bucket``), or None."""
    for r in records:
        if r["group"] == group and r["arm"] == arm and (bucket is None or r["bucket"] == bucket):
            return r
    return None


def claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidate records whose verdict claims a loss."""
    return [r for r in records if r["role"] == "candidate" and str(r["verdict"]).startswith("loss")]


def floor_rejections(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The A/A floor records that reject (they forbid every claim in their bucket)."""
    return [r for r in records if r["role"] == FLOOR_ROLE and r["p"] == r["p"] and r["p"] < ALPHA]
