"""The one rule from the study's evidence to an answer: Turn FP8 on, Keep 16-bit, or Not decided yet.

The rule reads each input's *state* (how it is known) and, for a measured change, its interval; it
never fires on a point estimate whose interval crosses a threshold. Only computed, measured and
profile-stated inputs decide; published, simulated and "no claim" inputs are shown but decide
nothing. The README's table "The decision rule" restates :func:`decide` row by row.

Thresholds are named parameters a profile may set (its ``decision:`` mapping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from kvstudy.bench.spec import Spec
from kvstudy.io import is_finite_number
from kvstudy.limits import Number

Percent = Annotated[Number, Field(ge=0, lt=100)]

TURN_ON = "Turn FP8 on"
KEEP = "Keep 16-bit"
UNDECIDED = "Not decided yet"

# How an input is known. Only DECISIVE states can make the rule fire.
COMPUTED = "computed"  # from the model's config (no run needed)
MEASURED = "measured"  # with the interval or test stated
PUBLISHED = "published"  # published figures, restated
SIMULATED = "simulated"  # on a simulation of FP8 storage, not on the engine's own FP8 (decides nothing)
NOT_MEASURED = "not measured"
NO_CLAIM = "no claim"  # measured, but the data cannot support a claim
STATED = "stated by the profile"
# The states a notebook's verdict may give (kvstudy.report.notebook.verdict).
VERDICT_STATES = (COMPUTED, MEASURED, PUBLISHED, NO_CLAIM, SIMULATED, NOT_MEASURED)
DECISIVE = frozenset({COMPUTED, MEASURED, STATED})


class Thresholds(Spec):
    """What the rule compares against; a profile's ``decision:`` mapping may set each."""

    min_fp8_share: Annotated[Number, Field(gt=0, le=1)] = 0.5  # share of a request's KV bytes FP8 must store
    accuracy_margin_points: Percent = 1.0  # largest accuracy loss (points) still "within the margin"
    tpot_cost_pct: Percent = 5.0  # a per-token slowdown beyond this is a cost the benefit must repay
    min_users_gain_pct: Percent = 10.0  # fewer extra users within target than this does not repay that cost
    kv_bound: bool | None = None  # the profile states whether its workload is KV-bound (None: not stated)


@dataclass(frozen=True)
class Input:
    """One piece of evidence: its state, its values (plain numbers and words) and where it came from."""

    state: str
    source: str
    values: dict[str, Any]

    def get(self, key: str) -> Any:
        """A finite number or a plain value; None for a missing, non-finite or odd one."""
        value = self.values.get(key)
        return value if isinstance(value, (bool, str)) or is_finite_number(value) else None

    def num(self, key: str) -> float | None:
        """A finite number (not a bool), else None."""
        value: Any = self.values.get(key)
        return float(value) if is_finite_number(value) else None

    @property
    def decisive(self) -> bool:
        return self.state in DECISIVE


ABSENT = Input(NOT_MEASURED, "not measured", {})


@dataclass(frozen=True)
class Evidence:
    """What the card knows. ``capacity``: fp8_share, users_baseline, users_fp8; ``load``: claim,
    users_ratio_low/high; ``screen``: equivalence, margin_state, simulated; ``accuracy``: one per
    accuracy verdict, change_low/high in points; ``tpot``: ratio_low/high (FP8 / 16-bit, 1 user);
    ``scales``: what the checkpoints' KV scales are (shown, decides nothing)."""

    capacity: Input = ABSENT
    load: Input = ABSENT
    screen: Input = ABSENT
    accuracy: tuple[Input, ...] = ()
    tpot: Input = ABSENT
    scales: Input = ABSENT


@dataclass(frozen=True)
class Missing:
    """A measurement the answer waits for: what, and the step that gets it."""

    what: str
    step: str


@dataclass(frozen=True)
class Decision:
    answer: str
    rule: str  # the rule that fired, as the README's table names it
    reason: str  # the main reason, a short clause
    missing: tuple[Missing, ...] = ()


def points(value: float) -> str:
    """``1 point``, ``2.5 points``."""
    return f"{value:g} point" + ("" if value == 1 else "s")


def _accuracy_verdict(acc: Input, margin: float) -> str | None:
    """'within' (the interval's low end above -margin), 'beyond' (its high end below -margin), else None."""
    if not acc.decisive:
        return None
    low, high = acc.num("change_low"), acc.num("change_high")
    if low is not None and low > -margin:
        return "within"
    if high is not None and high < -margin:
        return "beyond"
    return None


def _screen_verdict(screen: Input, margin_points: float) -> str | None:
    """The screen's equivalence as an accuracy verdict at ``margin_points``: a margin calibrated at a
    larger loss (``margin_points`` fact) cannot show "within", one at a smaller loss cannot show "beyond"."""
    if not screen.decisive or screen.get("simulated") is True:
        return None
    points = screen.num("margin_points")
    if screen.get("equivalence") == "beyond" and (points is None or points >= margin_points):
        return "beyond"
    if screen.get("equivalence") == "within" and screen.get("margin_state") in ("calibrated", "assumed"):
        return "within" if points is None or points <= margin_points else None
    return None


def decide(ev: Evidence, th: Thresholds) -> Decision:
    """The answer, the rule that fired and its reason; for Not decided yet, each missing input."""
    cap, load = (i if i.decisive else ABSENT for i in (ev.capacity, ev.load))  # the others decide nothing
    share = cap.num("fp8_share")
    if share is not None and share < th.min_fp8_share:
        if share <= 0:
            return Decision(
                KEEP, "nothing to store", "FP8 would store none of this model's KV: every layer stays 16-bit"
            )
        return Decision(
            KEEP,
            "little to store",
            f"FP8 would store only {share:.0%} of each request's KV bytes (below {th.min_fp8_share:.0%})",
        )
    users16, users8 = cap.num("users_baseline"), cap.num("users_fp8")
    if users16 and users8 is not None and users8 <= users16:
        return Decision(KEEP, "no more users", "FP8 fits no more users at this context on this GPU")
    accuracy = [v for v in (_accuracy_verdict(a, th.accuracy_margin_points) for a in ev.accuracy) if v]
    screen = _screen_verdict(ev.screen, th.accuracy_margin_points)
    if screen == "beyond" or "beyond" in accuracy:
        return Decision(
            KEEP, "accuracy beyond margin", f"FP8 loses more than {points(th.accuracy_margin_points)} of accuracy"
        )
    load_low, load_high = load.num("users_ratio_low"), load.num("users_ratio_high")
    if load.get("claim") == "fewer users" and load_high is not None and load_high < 1:
        return Decision(KEEP, "fewer users", "FP8 serves fewer users within the latency target at equal memory")
    tpot_low = ev.tpot.num("ratio_low") if ev.tpot.decisive else None
    costly = tpot_low is not None and tpot_low > 1 + th.tpot_cost_pct / 100
    small_gain = load_high is not None and load_high < 1 + th.min_users_gain_pct / 100
    if costly and (th.kv_bound is False or small_gain):
        return Decision(
            KEEP,
            "cost not repaid",
            f"FP8 costs over {th.tpot_cost_pct:g} % per token and "
            + ("the workload is not KV-bound" if th.kv_bound is False else "gains too few users to repay it"),
        )
    missing: list[Missing] = []
    if share is None:
        missing.append(Missing("capacity", "the KV bytes per token and the users that fit"))
    elif users16 is None or users8 is None or users8 <= 0:
        missing.append(Missing("capacity", "the users that fit on this GPU (the weights, or a TP at which they fit)"))
    measured_gain = load.get("claim") == "more users" and load_low is not None and load_low > 1
    if not measured_gain and th.kv_bound is not True:
        missing.append(Missing("load", "users within the latency target at equal memory"))
    elif not measured_gain and costly:
        missing.append(Missing("load", "whether the extra users repay FP8's per-token cost"))
    if screen != "within" and "within" not in accuracy:
        missing.append(Missing("accuracy", f"accuracy within {points(th.accuracy_margin_points)}"))
    if missing:
        return Decision(
            UNDECIDED, "evidence missing", "not yet known: " + ", ".join(m.step for m in missing), tuple(missing)
        )
    gain = f"{users8 / users16:.1f}x the users fit" if users16 and users8 else "more users fit"
    why = "measured more users within target" if measured_gain else "the profile states a KV-bound workload"
    return Decision(
        TURN_ON, "all conditions met", f"{gain}, {why}, accuracy within {points(th.accuracy_margin_points)}"
    )
