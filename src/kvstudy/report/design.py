"""``kvstudy design``: what it would take to decide, for speed and for accuracy.

    kvstudy design speed [--capture DIR | --noise-sd SD] [--change PCT ...] [--power P] [--json]
    kvstudy design accuracy [--margin-points M ...] [--discordance D | --totals N BASE CAND] [--json]
    kvstudy design load [--capture DIR | --noise-sd SD] [--change PCT ...] [--power P] [--json]

Speed: from the A/A noise of a sweep capture (the baseline and its repeat, seed blocks;
:func:`kvstudy.speed.calibration.noise_sd`), or a noise SD given, or an assumed default (labelled
assumed), the seed blocks per arm (one run per arm each) the verdict's blocked sign-flip test needs to
claim a TPOT change of X % with 80 % power (:func:`kvstudy.stats.permutation.runs_needed`).

Load: the same blocked sign-flip test on per-block log users within the latency target (notebook 08):
the noise is the SD over seed blocks of log(A/A users / baseline users) in a load capture; where the
A/A knees never differ (the ladder's steps are coarser than the noise), the SD of rounding to those
steps (the log step ratio / sqrt(12), labelled so); the seed blocks a change of X % in users needs.

Accuracy: from the share of questions on which two configurations disagree (given; or the range
the published totals allow; or assumed values), the questions a paired non-inferiority test at a
margin of M points needs to pass with 80 % power when the configurations truly score alike
(:func:`kvstudy.stats.binary_power.non_inferiority_questions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvstudy.accuracy.verdicts import ASSUMED_DISCORDANCE
from kvstudy.decision_rule import points
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_DESIGN_ROWS
from kvstudy.speed.calibration import noise_sd
from kvstudy.stats.binary import TARGET_POWER
from kvstudy.stats.binary_power import check_totals, non_inferiority_questions
from kvstudy.stats.permutation import RunsNeeded, runs_needed

ASSUMED_NOISE_SD = 0.05  # SD of a per-seed log TPOT difference when no capture or value is given (assumed)
DEFAULT_CHANGES_PCT = {"speed": (5.0, 10.0, 20.0), "load": (50.0, 100.0)}
DEFAULT_MARGINS_POINTS = (1.0, 2.0, 5.0)
NoiseState = Literal["measured", "not estimable", "given", "assumed"]


@dataclass(frozen=True)
class RunsDesign:
    """The seed blocks per arm one change (in TPOT, or in users within the target) needs, and where the
    noise came from."""

    users: int | None  # the capture's user count the noise was measured at; None: no capture
    noise_sd: float
    noise_state: NoiseState
    noise_origin: str  # the state and what it was measured on or why not
    change_pct: float
    runs_per_arm: int | None  # None: more than the method searches
    method: str
    power: float


@dataclass(frozen=True)
class AccuracyDesign:
    """The questions one non-inferiority margin needs at one discordance, and its origin."""

    margin_points: float
    discordance: float
    discordance_origin: str
    questions: int
    power: float


Noise = tuple[int | None, float | None, NoiseState, str]  # users, SD (None: not estimable), state, origin
ASSUMED_NOISE: dict[str, Noise] = {
    "speed": (None, ASSUMED_NOISE_SD, "assumed", "assumed (no capture or --noise-sd given)"),
    "load": (None, ASSUMED_NOISE_SD * 4, "assumed", "assumed: 0.2 (no capture or value given)"),
}


def capture_noise(capture_dir: str | Path) -> list[Noise]:
    """Per user count of a sweep capture: its A/A noise SD (or why none)."""
    from kvstudy.speed import analysis, verdicts_table

    cap = analysis.load_capture(capture_dir)
    if not cap.spec.aa_arms():
        return [(None, None, "not estimable", f"{capture_dir}: no A/A repeat of the baseline in this capture")]
    out: list[Noise] = []
    for users in cap.spec.users:
        runs = verdicts_table.aa_runs(cap, int(users))
        usable = [r for r in runs if r.measurable and r.tpots_s]
        found = noise_sd(usable)
        if found is None:
            why = f"not estimable: {len(usable)} measurable of {len(runs)} A/A runs"
            out.append((int(users), None, "not estimable", why))
        else:
            why = f"measured: A/A noise of {capture_dir} at {users} user(s), {found[1]} df"
            out.append((int(users), found[0], "measured", why))
    return out


def load_noise(capture_dir: str | Path) -> Noise:
    """SD over seed blocks of log(A/A users / baseline users) in a load capture, and where it came from."""
    import numpy as np

    from kvstudy.load import analysis as load

    cap = load.load_capture(capture_dir)
    aa = cap.spec.aa_arms()
    if not aa:
        raise StudyError(f"{capture_dir}: no A/A arm (the baseline repeated under another name): no noise to measure")
    knees = load.knees(cap)
    base, rep = knees[cap.spec.arms[0].name], knees[aa[0]]
    logs = [math.log(rep[s].users / base[s].users) for s in base if s in rep and base[s].users and rep[s].users]
    if len(logs) < 2:
        raise StudyError(f"{capture_dir}: {len(logs)} seed block(s) with both A/A knees, expected at least 2")
    sd = float(np.std(logs, ddof=1))
    if sd > 0:
        return None, sd, "measured", f"measured: A/A users over {len(logs)} seed blocks"
    loads = cap.spec.loads()
    step = max(b / a for a, b in zip(loads, loads[1:]))
    why = (
        f"the A/A knees agreed in all {len(logs)} blocks, so the SD of rounding to the largest load step (x{step:.2f})"
    )
    return None, math.log(step) / math.sqrt(12), "measured", f"ladder resolution: {why} is used"


def runs_design(
    what: Literal["speed", "load"],
    changes_pct: Sequence[float] | None = None,
    capture_dir: str | Path | None = None,
    sd: float | None = None,
    power: float = TARGET_POWER,
) -> list[RunsDesign]:
    """One row per (noise source, change): the seed blocks per arm a change in TPOT (``speed``) or in
    users within the target (``load``) needs; ``changes_pct`` None: :data:`DEFAULT_CHANGES_PCT`."""
    if capture_dir is not None and sd is not None:
        raise StudyError(f"design {what}: give --capture or --noise-sd, not both")
    changes_pct = DEFAULT_CHANGES_PCT[what] if changes_pct is None else changes_pct
    noises: list[Noise] = [(None, sd, "given", "given")] if sd is not None else [ASSUMED_NOISE[what]]
    if capture_dir is not None:
        noises = capture_noise(capture_dir) if what == "speed" else [load_noise(capture_dir)]
    if len(noises) * len(changes_pct) > MAX_DESIGN_ROWS:
        raise StudyError(
            f"design {what}: {len(noises)} noise estimate(s) x {len(changes_pct)} change(s) = "
            f"{len(noises) * len(changes_pct)} designs, expected at most {MAX_DESIGN_ROWS} (give fewer --change values)"
        )
    rows = []
    for users, sigma, state, origin in noises:
        for pct in changes_pct:
            need = (
                RunsNeeded(pct / 100.0, math.nan, None, "no noise estimate")
                if sigma is None
                else runs_needed(sigma, pct / 100.0, power=power)
            )
            rows.append(RunsDesign(users, need.sigma, state, origin, pct, need.runs_per_arm, need.method, power))
    return rows


def load_lines(rows: Sequence[RunsDesign]) -> list[str]:
    if not rows:
        return []
    head = (
        f"noise SD of log users per seed block {rows[0].noise_sd:.3f} ({rows[0].noise_origin}); power {rows[0].power:g}"
    )
    return [head] + [
        f"users within the target changed by {r.change_pct:g} %: "
        + (f"{r.runs_per_arm} seed blocks per arm" if r.runs_per_arm else "more blocks than searched")
        + f" ({r.method})"
        for r in rows
    ]


def discordances(discordance: float | None = None, totals: Sequence[int] | None = None) -> list[tuple[float, str]]:
    """The discordances to plan with and where each came from."""
    if discordance is not None and totals is not None:
        raise StudyError("design accuracy: give --discordance or --totals, not both")
    if discordance is not None:  # a share in (0, 1]: the command's --discordance bound
        return [(discordance, "given")]
    if totals is not None:
        try:
            n, base, cand = check_totals(*totals)
        except StudyError as exc:
            raise StudyError(f"--totals N BASE CAND: {exc}") from None
        low = max(abs(base - cand), 1) / n
        high = min(base + cand, 2 * n - base - cand) / n
        if high <= 0:
            raise StudyError(
                f"--totals N BASE CAND: {base}/{n} and {cand}/{n} allow no question on which the two disagree "
                "(both all wrong or all right), so they say nothing of the discordance; give --discordance"
            )
        where = f"allowed by the totals {base}/{n} and {cand}/{n}"
        return [(low, f"{where}: fewest disagreements"), (high, f"{where}: most disagreements")]
    return [(d, "assumed (no discordance or totals given)") for d in ASSUMED_DISCORDANCE]


def accuracy_design(
    margins_points: Sequence[float] = DEFAULT_MARGINS_POINTS,
    discordance: float | None = None,
    totals: Sequence[int] | None = None,
    power: float = TARGET_POWER,
    planned: Sequence[tuple[float, str]] = (),
) -> list[AccuracyDesign]:
    """One row per (discordance, margin): the questions a non-inferiority verdict needs. ``planned``:
    (discordance, origin) pairs a report observed; otherwise :func:`discordances`."""
    rows = []
    for psi, origin in [p for p in planned if p[0] > 0] or discordances(discordance, totals):
        for margin in margins_points:
            if not 0 < margin < 100:
                raise StudyError(f"--margin-points: expected points in (0, 100), got {margin}")
            rows.append(AccuracyDesign(margin, psi, origin, non_inferiority_questions(margin / 100, psi, power), power))
    return rows


def speed_lines(rows: Sequence[RunsDesign]) -> list[str]:
    out = []
    for r in rows:
        at = f"at {r.users} user(s), " if r.users is not None else ""
        need = f"{r.runs_per_arm} seed blocks per arm" if r.runs_per_arm else "not reachable"
        noise = f"noise SD {r.noise_sd:.3f} of a per-seed log difference" if math.isfinite(r.noise_sd) else "no noise"
        out.append(
            f"speed {at}a {r.change_pct:g} % TPOT change at {r.power * 100:.0f} % power: {need} ({r.method}; "
            f"{noise}, {r.noise_origin})"
        )
    return out


def accuracy_lines(rows: Sequence[AccuracyDesign]) -> list[str]:
    return [
        f"accuracy: non-inferiority at a margin of {points(r.margin_points)}, {r.power * 100:.0f} % power: "
        f"{r.questions:,} questions (discordance {r.discordance:.1%}, {r.discordance_origin}; normal approximation)"
        for r in rows
    ]


def need_sentence(rows: Sequence[AccuracyDesign], unit: str = "questions") -> str:
    """The most questions (``unit``) any planned discordance needs, as the card's next step says it."""
    worst = max(rows, key=lambda r: r.questions)
    return (
        f"a non-inferiority verdict at {points(worst.margin_points)} needs about {worst.questions:,} {unit} at "
        f"{worst.power * 100:.0f} % power (discordance {worst.discordance:.1%}, {worst.discordance_origin}; "
        "kvstudy design accuracy)"
    )
