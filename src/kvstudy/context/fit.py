"""ITL = a + b * L per arm, with bootstrap intervals; slope ratio and break-even length between arms.

The data are per-request TPOTs (vLLM's definition: (latency - TTFT) / (output tokens - 1)) at each
input length L, grouped in runs (one server start = one seed of one arm). The point fit is ordinary
least squares through the per-(run, length) mean TPOTs. Intervals come from a two-level bootstrap:
runs resampled with replacement within the arm, then requests within each (run, length) cell; the
95 % interval is the 2.5 and 97.5 percentiles of the replicates. With few runs the run level has few
distinct draws, so the interval is if anything too narrow about between-run noise: say so with it.

A slope is "resolved" only when its interval excludes 0. The break-even length between a baseline
and a candidate, ``L* = (a_cand - a_base) / (b_base - b_cand)``, is claimed only when the slope
difference's interval excludes 0, and is reported as "none within the measured range" when it
falls outside the measured lengths.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvstudy.bench.grid import Captured
from kvstudy.bench.measurability import Measurability, assess_run
from kvstudy.errors import StudyError
from kvstudy.stats.permutation import bootstrap_line, ols, percentile_interval

DEFAULT_BOOT = 2000


Runs = dict[str, dict[int, np.ndarray]]  # one arm's runs: run -> input length -> finite TPOTs (ms)


@dataclass(frozen=True)
class LineFit:
    """ITL = a + b * L for one arm, with 95 % bootstrap intervals."""

    arm: str
    runs: int
    lengths: tuple[int, ...]
    points: int
    intercept_ms: float
    slope_ms_per_token: float
    intercept_ci: tuple[float, float]
    slope_ci: tuple[float, float]
    boot_intercepts: tuple[float, ...] = field(repr=False, default=())
    boot_slopes: tuple[float, ...] = field(repr=False, default=())

    @property
    def resolved(self) -> bool:
        """The slope's interval excludes 0."""
        return self.slope_ci[0] > 0 or self.slope_ci[1] < 0


@dataclass(frozen=True)
class ArmComparison:
    """Candidate vs baseline: slope ratio and break-even length, each with an interval or a reason."""

    baseline: str
    candidate: str
    slope_ratio: float | None
    slope_ratio_ci: tuple[float, float] | None
    slope_difference_ci: tuple[float, float] | None
    break_even_tokens: float | None
    break_even_ci: tuple[float, float] | None
    statement: str


def fit_arm(arm: str, runs: Runs, n_boot: int = DEFAULT_BOOT, seed: int = 0) -> LineFit:
    """Fit one arm's runs (``fit_all`` hands it those over two lengths at least); raises StudyError
    when they cannot be fitted."""
    xs = np.asarray([L for r in runs.values() for L in r], dtype=float)
    ys = np.asarray([v.mean() for r in runs.values() for v in r.values()], dtype=float)
    a, b = ols(xs, ys)
    boot_a, boot_b = bootstrap_line(runs, n_boot, seed)
    ok = np.isfinite(boot_b)
    if ok.sum() < max(10, n_boot // 2):
        raise StudyError(f"fit {arm}: too few bootstrap draws span two lengths ({int(ok.sum())} of {n_boot})")
    return LineFit(
        arm,
        len(runs),
        tuple(sorted(set(int(x) for x in xs))),
        int(xs.size),
        a,
        b,
        percentile_interval(boot_a[ok]),
        percentile_interval(boot_b[ok]),
        tuple(boot_a),
        tuple(boot_b),
    )


def compare_arms(base: LineFit, cand: LineFit) -> ArmComparison:
    """Slope ratio (candidate / baseline) and break-even length, each with a 95 % interval or a reason."""
    ba, bb = np.asarray(base.boot_intercepts), np.asarray(base.boot_slopes)
    ca, cb = np.asarray(cand.boot_intercepts), np.asarray(cand.boot_slopes)
    n = min(ba.size, ca.size)
    ba, bb, ca, cb = ba[:n], bb[:n], ca[:n], cb[:n]
    ok = np.isfinite(bb) & np.isfinite(cb)
    diff = bb[ok] - cb[ok]
    diff_ci = percentile_interval(diff) if diff.size else None
    ratio = cand.slope_ms_per_token / base.slope_ms_per_token if base.resolved and base.slope_ms_per_token > 0 else None
    ratio_ci = None
    if ratio is not None:
        pos = ok & (bb > 0)
        ratio_ci = percentile_interval(cb[pos] / bb[pos]) if pos.sum() >= n // 2 else None
    lo, hi = min(base.lengths + cand.lengths), max(base.lengths + cand.lengths)
    names = f"{cand.arm} vs {base.arm}"

    def no_break_even(reason: str) -> ArmComparison:
        # ratio and ratio_ci are None already when the baseline's slope is not resolved
        return ArmComparison(base.arm, cand.arm, ratio, ratio_ci, diff_ci, None, None, f"{names}: {reason}")

    if not base.resolved:
        return no_break_even(
            f"{base.arm}'s slope is not resolved (its interval includes 0): no ratio or break-even claimed"
        )
    if diff_ci is None or diff_ci[0] <= 0 <= diff_ci[1]:
        return no_break_even(
            "the slopes are not resolved apart (difference interval includes 0): no break-even claimed"
        )
    d = base.slope_ms_per_token - cand.slope_ms_per_token
    if d < 0:
        return no_break_even(f"{cand.arm}'s latency grows faster with context: no break-even")
    length = (cand.intercept_ms - base.intercept_ms) / d
    boot = (ca[ok] - ba[ok]) / diff
    be_ci = percentile_interval(boot[np.isfinite(boot)])
    if length <= lo:
        text = (
            f"{names}: {cand.arm} is at least as fast from the shortest measured length ({lo:,} tokens); "
            f"the lines cross at {length:,.0f}"
        )
    elif length > hi:
        text = (
            f"{names}: none within the measured range ({lo:,}..{hi:,} tokens); the lines would cross at "
            f"{length:,.0f} tokens (extrapolated, 95 % interval {be_ci[0]:,.0f}..{be_ci[1]:,.0f})"
        )
    else:
        text = f"{names}: break-even at {length:,.0f} tokens (95 % interval {be_ci[0]:,.0f}..{be_ci[1]:,.0f})"
    return ArmComparison(base.arm, cand.arm, ratio, ratio_ci, diff_ci, length, be_ci, text)


# --------------------------------------------------------------------------- from a capture


def check_cell(cell: Captured) -> Measurability:
    """A cell is measurable when it ran and its requests pass the bench layer's measurability check
    (nothing failed, every output had the asked length, the tokens were not delivered in bursts)."""
    if not cell.ok:
        return Measurability(cell.id, False, [cell.reason or "failed"])
    return assess_run(cell.requests, cell.id, expected_output_len=cell.data.get("output_len"))


def cells_from_records(records: Iterable[Captured]) -> tuple[dict[str, Runs], list[Measurability]]:
    """The finite TPOTs of the measurable captured cells by arm and run, and the check of every cell."""
    arms: dict[str, Runs] = {}
    checks: list[Measurability] = []
    for rec in records:
        chk = check_cell(rec)
        checks.append(chk)
        tpots = np.asarray([r.tpot_ms for r in rec.requests if r.tpot_ms is not None], dtype=float)
        tpots = tpots[np.isfinite(tpots)]
        if chk.measurable and tpots.size:
            arm = str(rec.data["arm"])
            arms.setdefault(arm, {}).setdefault(f"{arm}__s{rec.data['seed']}", {})[int(rec.data["input_len"])] = tpots
    return arms, checks


def fit_all(arms: dict[str, Runs], n_boot: int = DEFAULT_BOOT, seed: int = 0) -> dict[str, LineFit]:
    """One fit per arm that has at least two distinct lengths."""
    return {
        arm: fit_arm(arm, runs, n_boot, seed)
        for arm, runs in arms.items()
        if len({L for r in runs.values() for L in r}) >= 2
    }
