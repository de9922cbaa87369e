"""Users within a latency target: the knee of each arm's load ladder, and the FP8 / 16-bit ratio.

A request is within the target as vLLM's ``bench serve --goodput`` counts it; a cell meets the
target when ``target_share`` of its requests are within it; an arm's users within the target in one
seed block is the largest load up to which every cell met it. Across seed blocks the ratio is the
geometric mean of per-block ratios with a t interval, tested by the seed-blocked permutation test;
a claim needs the Holm p below alpha, the interval excluding 1 and a measured knee in every block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstudy.stats.clustered import clustered_mean
from kvstudy.stats.family import holm
from kvstudy.stats.permutation import blocks_needed, permutation_test

ALPHA = 0.05
CONFIDENCE = 0.95
MEASURED, MISSED, HELD, NO_CELLS = "measured", "missed at the lowest load", "held at every load", "no finished cell"


def share_within(records: Iterable[Any], target: Mapping[str, float]) -> tuple[int, int]:
    """(requests within the target, requests) of a cell's per-request records, by vLLM's goodput rule:
    a request succeeded and met each limit in ``target`` (ms); one output token (no TPOT) counts as TPOT 0."""
    rows = [(r.success, {"ttft": r.ttft_ms, "tpot": r.tpot_ms or 0.0, "e2el": r.e2el_ms}) for r in records]
    return sum(ok and all(v[k] <= limit for k, limit in target.items()) for ok, v in rows), len(rows)


@dataclass(frozen=True)
class Knee:
    """One arm's users within the target in one seed block."""

    users: int
    state: str  # MEASURED, MISSED, HELD or NO_CELLS
    last_met: int | None = None  # the largest load that met the target before the first miss
    first_miss: int | None = None  # the load at which the target was first missed


def users_within(shares: Mapping[int, float | None], target_share: float) -> Knee:
    """The knee of one ladder: ``shares`` maps each load to its share within the target (None: the
    cell did not run, counted as a miss)."""
    loads = sorted(shares)
    if not loads or all(shares[load] is None for load in loads):
        return Knee(0, NO_CELLS)
    last = None
    for load in loads:
        share = shares[load]
        if share is None or share < target_share:
            return Knee(0, MISSED, None, load) if last is None else Knee(last, MEASURED, last, load)
        last = load
    return Knee(loads[-1], HELD, loads[-1], None)


@dataclass
class UsersComparison:
    """Candidate vs baseline users within the target over seed blocks."""

    baseline: str
    candidate: str
    blocks: int
    baseline_users: list[int]
    candidate_users: list[int]
    baseline_states: list[str]
    candidate_states: list[str]
    ratio: float | None = None  # geometric mean of per-block candidate / baseline
    ratio_low: float | None = None
    ratio_high: float | None = None
    p_value: float | None = None
    min_p_value: float | None = None
    p_holm: float | None = None
    claim: str = "no claim"
    reasons: list[str] = field(default_factory=list)

    @property
    def users_baseline(self) -> int | None:
        return int(np.median(self.baseline_users)) if self.baseline_users else None

    @property
    def users_candidate(self) -> int | None:
        return int(np.median(self.candidate_users)) if self.candidate_users else None


def compare_users(
    baseline: str,
    candidate: str,
    base: Mapping[int, Knee],
    cand: Mapping[int, Knee],
) -> UsersComparison:
    """Users within the target of two arms over the seed blocks both have (keys: seeds). No Holm here."""
    seeds = [s for s in base if s in cand]
    out = UsersComparison(
        baseline,
        candidate,
        len(seeds),
        [base[s].users for s in seeds],
        [cand[s].users for s in seeds],
        [base[s].state for s in seeds],
        [cand[s].state for s in seeds],
    )
    if not seeds:
        out.reasons.append("no seed block holds both arms")
        return out
    usable = [s for s in seeds if base[s].users > 0 and cand[s].users > 0]
    if len(usable) < len(seeds):
        out.reasons.append(
            f"{len(seeds) - len(usable)} seed block(s) with no load within the target for an arm: no ratio there"
        )
    if not usable:
        return out
    logs = np.log([cand[s].users / base[s].users for s in usable])
    out.ratio = float(math.exp(logs.mean()))
    if logs.size >= 2:  # the t interval of the mean log ratio: each block its own cluster
        mean = clustered_mean(logs, range(logs.size), alpha=1 - CONFIDENCE)
        out.ratio_low, out.ratio_high = math.exp(mean.ci_low), math.exp(mean.ci_high)
    test = permutation_test(
        [math.log(base[s].users) for s in usable],
        [math.log(cand[s].users) for s in usable],
        base_blocks=usable,
        cand_blocks=usable,
    )
    out.p_value, out.min_p_value = test.p_value, test.min_p_value
    return out


def blocks_for_family(tests: int) -> int:
    """Seed blocks (one run per arm each) with which the blocked test's smallest p passes Holm's first
    step over ``tests`` tests (tests x its smallest p < ALPHA)."""
    return blocks_needed(ALPHA / max(1, tests))


def decide(comparisons: Sequence[UsersComparison], other_p: Sequence[float] = ()) -> list[float]:
    """Holm over the users tests and ``other_p`` (the report's other tests), then each claim, in place;
    returns the Holm p of ``other_p``."""
    tested = [c for c in comparisons if c.p_value is not None]
    adjusted = holm([float(c.p_value) for c in tested if c.p_value is not None] + list(other_p))
    for c, p in zip(tested, adjusted):
        c.p_holm = p
    for c in comparisons:
        c.claim = "no claim"
        if c.p_value is None:
            continue
        family = len(tested) + len(other_p)
        if c.min_p_value is not None and c.min_p_value * family >= ALPHA:
            c.reasons.append(
                f"{c.blocks} seed block(s) cannot reach p < {ALPHA:g} after Holm over {family} test(s) (smallest p "
                f"{c.min_p_value:.3g}; {blocks_for_family(family)} blocks can)"
            )
        censored = [s for s in (*c.baseline_states, *c.candidate_states) if s != MEASURED]
        if censored:
            c.reasons.append(
                "not every block has a measured knee (" + ", ".join(sorted(set(censored))) + "): the count is a bound"
            )
        excludes_one = c.ratio_low is not None and c.ratio_high is not None and (c.ratio_low > 1 or c.ratio_high < 1)
        if c.p_holm is not None and c.p_holm < ALPHA and excludes_one and not censored:
            c.claim = "more users" if (c.ratio or 1) > 1 else "fewer users"
        elif c.p_holm is not None and c.p_holm >= ALPHA:
            c.reasons.append(f"p after Holm {c.p_holm:.3g} ≥ {ALPHA:g}")
        elif not excludes_one:
            c.reasons.append("the interval of the ratio holds 1")
    return adjusted[len(tested) :]
