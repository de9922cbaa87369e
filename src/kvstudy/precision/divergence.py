"""KL divergence from top-k log-probabilities, the equivalence (TOST) verdict against a margin, and
the margin read off a graded positive control.

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
accuracy is shown to fall by ``loss_points`` gives the margin. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvstudy.errors import StudyError

REST_FLOOR = 1e-7  # the smallest rest mass counted (float32 resolves no finer near 1)
LOSS_POINTS = 2.0  # the accuracy loss (points) the margin is calibrated to
EQUIVALENCE = ("within", "beyond", "undecided")
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

    state: str  # one of EQUIVALENCE
    low: float  # the lower one-sided (1 - alpha) bound of the mean used for "beyond"
    high: float  # the upper one-sided (1 - alpha) bound of the mean used for "within"
    margin: float | None
    reason: str


def equivalence(low: float, high: float, margin: float | None, two_sided: bool = False) -> Equivalence:
    """*within* / *beyond* / *undecided* for a mean whose one-sided (1 - alpha) bounds are ``low`` and
    ``high`` (i.e. its 1 - 2 alpha interval). ``two_sided``: the margin is ±margin (a difference such
    as Δ log p); else a non-negative quantity (a divergence) against ``margin``."""
    if margin is None or not math.isfinite(margin) or margin <= 0:
        return Equivalence("undecided", low, high, None, "no margin to test against")
    if not (math.isfinite(low) and math.isfinite(high)):
        return Equivalence("undecided", low, high, margin, "no interval (fewer than two clusters)")
    inside = (-margin < low and high < margin) if two_sided else high < margin
    outside = (high < -margin or low > margin) if two_sided else low > margin
    state, where = (
        ("within", "lies inside") if inside else ("beyond", "lies past") if outside else ("undecided", "straddles")
    )
    return Equivalence(state, low, high, margin, f"the interval {low:.3g} to {high:.3g} {where} the margin")


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
    margin_kl: float | None
    margin_delta_logp: float | None  # a magnitude, nats/token
    grade: float | None  # the factor at which accuracy first fell by loss_points
    change_points: float | None
    change_low: float | None
    change_high: float | None
    ranked: dict[str, bool]  # instrument -> the grades rank in order on it (no reversal beyond the noise)
    reason: str
    margin_kl_high: float | None = None  # the KL's upper one-sided bound at that grade
    below: float | None = None  # the largest factor below it (its accuracy change did not reach the loss)
    below_kl: float | None = None  # that grade's KL: the 2-point loss lies between below_kl and margin_kl


def in_order(values: Sequence[float], lows: Sequence[float], highs: Sequence[float], increasing: bool) -> bool:
    """No larger grade is better than a smaller one beyond the noise: a reversal counts when the two
    grades' intervals do not overlap (without intervals, nan: any reversal counts)."""
    for i in range(len(values) - 1):
        a, b = values[i], values[i + 1]
        reversed_ = b < a if increasing else b > a
        if not reversed_:
            continue
        hi_b, lo_a = (highs[i + 1], lows[i]) if increasing else (highs[i], lows[i + 1])
        if not (math.isfinite(hi_b) and math.isfinite(lo_a)) or hi_b < lo_a:
            return False
    return True


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

    def order(value: str, low: str, high: str, increasing: bool) -> bool:
        column = {f: [float(getattr(g, f)) for g in ladder] for f in (value, low, high)}
        return in_order(column[value], column[low], column[high], increasing=increasing)

    ranked = {
        "KL": order("kl", "kl_low", "kl_high", True),
        "Δ log p": order("delta_logp", "delta_logp_low", "delta_logp_high", False),
        "accuracy": order("change_points", "change_low", "change_high", False),
    }
    reached = next((g for g in ladder if g.change_high < -loss_points), None)
    unranked = ", ".join(name for name, ok in ranked.items() if not ok)
    if unranked or reached is None:
        why = (
            f"the grades are out of order on: {unranked}"
            if unranked
            else f"no grade is shown to lose {loss_points:g} points (the largest factor {ladder[-1].factor:g} "
            f"changes accuracy by {ladder[-1].change_points:+.1f} points)"
        )
        return Calibration("not calibrated", None, None, None, None, None, None, ranked, why)
    below = ladder[ladder.index(reached) - 1] if ladder.index(reached) > 0 else None
    return Calibration(
        "calibrated",
        reached.kl,
        abs(reached.delta_logp),
        reached.factor,
        reached.change_points,
        reached.change_low,
        reached.change_high,
        ranked,
        f"factor {reached.factor:g} is the first grade shown to lose {loss_points:g} points or more "
        f"({reached.change_points:+.1f}, 95 % {reached.change_low:+.1f} to {reached.change_high:+.1f})",
        reached.kl_high if math.isfinite(reached.kl_high) else None,
        below.factor if below else None,
        below.kl if below else None,
    )
