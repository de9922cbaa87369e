"""``kvstudy kv-calibrate``: the equivalence margin read off a graded positive control through vLLM.

Each grade is a control checkpoint whose keys are ``factor`` times larger
(``kvstudy control-checkpoint --factor F --no-scales``: 16-bit answers unchanged, FP8 at scale 1.0
saturates more the larger F is), with two captures made by the project's runners:

- an accuracy capture (``kvstudy gsm8k`` or ``kvstudy retrieval`` with ``--model`` the grade's
  checkpoint and configurations ``bf16,fp8-kv``): the FP8 arm against the grade's 16-bit arm, paired
  per question, gives the accuracy change in points with Newcombe's 95 % interval;
- a screen capture (``kvstudy kv-screen --top-k K --allow-other-checkpoint``, baseline a 16-bit
  server of the unmodified model, candidate the grade's FP8 server): mean KL and Δ log p.

The grades must rank in order on every instrument; the first grade whose accuracy falls by 2 points
gives the KL and Δ log p margin (:func:`kvstudy.precision.divergence.calibrate`), else "not
calibrated". The 16-bit arm of the first grade is checked against ``--reference`` (the unmodified
model's 16-bit arm): a first grade that already loses 2 points there is a broken checkpoint.

    kvstudy kv-calibrate --grade 1 ACC1 SCREEN1 --grade 2048 ACC2048 SCREEN2048 [--reference ACC0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstudy.accuracy import runner as ge
from kvstudy.accuracy.records import correctness
from kvstudy.errors import StudyError
from kvstudy.io import bounded_float
from kvstudy.limits import MAX_FACTOR
from kvstudy.precision import divergence as dv
from kvstudy.precision import records as rc
from kvstudy.precision.paired_logp import pair_rows
from kvstudy.stats import binary as acc_stats

BASELINE, CANDIDATE = "bf16", "fp8-kv"


def _accuracy(capture: str | Path, name: str) -> tuple[dict[Any, bool], str]:
    results = ge.load_capture(capture, [name])
    res = results[name]
    if res.state != "ok":
        raise StudyError(f"{capture}: configuration {name} did not finish ({res.state}); expected a finished run")
    flt = ge.read_manifest(capture)["spec"]["settings"]["primary_filter"]
    return correctness(res.records, flt), flt


def grade_from_captures(
    factor: float, accuracy_capture: str | Path, screen_capture: str | Path, reference: str | Path | None = None
) -> dv.Grade:
    """One grade: the FP8 arm's accuracy change against the grade's 16-bit arm (points, Newcombe's
    interval) and the screen's mean KL and Δ log p; the grade's 16-bit arm against ``reference``."""
    base, _ = _accuracy(accuracy_capture, BASELINE)
    cand, _ = _accuracy(accuracy_capture, CANDIDATE)
    cmp = acc_stats.compare(base, cand, margin_points=dv.LOSS_POINTS)
    bf16_change = 0.0
    if reference is not None:
        ref, _ = _accuracy(reference, BASELINE)
        bf16_change = 100 * acc_stats.compare(ref, base, margin_points=dv.LOSS_POINTS).difference
    capture = rc.load(screen_capture)
    group = capture.groups[0]
    paired = pair_rows(capture.logp[(group.name, group.baseline)], capture.logp[(group.name, group.candidates[0])])
    if paired.kl is None:
        raise StudyError(f"{screen_capture}: no top-k log-probabilities (run kv-screen with --top-k)")
    return dv.Grade(
        factor,
        100 * cmp.difference,
        100 * cmp.interval.low,
        100 * cmp.interval.high,
        paired.kl.mean,
        paired.test.mean,
        bf16_change,
    )


def calibrate_ladder(
    grades: Sequence[tuple[float, str | Path, str | Path]], reference: str | Path | None = None
) -> tuple[list[dv.Grade], dv.Calibration]:
    """Every grade read, then :func:`kvstudy.precision.divergence.calibrate`."""
    ladder = [grade_from_captures(f, acc, scr, reference) for f, acc, scr in grades]
    return ladder, dv.calibrate(ladder)


def _cmd(args: argparse.Namespace) -> int:
    grades = [(bounded_float(f, "--grade FACTOR", 1.0, MAX_FACTOR), acc, scr) for f, acc, scr in args.grade]
    ladder, cal = calibrate_ladder(grades, args.reference)
    for g in ladder:
        print(
            f"factor {g.factor:g}: accuracy {g.change_points:+.1f} points (95 % {g.change_low:+.1f} to "
            f"{g.change_high:+.1f}), KL {g.kl:.4g} nats/token, Δ log p {g.delta_logp:+.4g} nats/token"
        )
    print(f"margin: {cal.state}; {cal.reason}" + (f"; KL {cal.margin_kl:.4g} nats/token" if cal.margin_kl else ""))
    if args.json:
        import json

        print(json.dumps({"grades": [asdict(g) for g in ladder], "calibration": asdict(cal)}, default=str))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("kv-calibrate", help="the KL / Δ log p margin from a graded control through vLLM")
    p.add_argument(
        "--grade",
        nargs=3,
        action="append",
        required=True,
        metavar=("FACTOR", "ACCURACY_CAPTURE", "SCREEN_CAPTURE"),
        help="one grade: its factor, its accuracy capture (bf16, fp8-kv) and its kv-screen capture",
    )
    p.add_argument("--reference", help="accuracy capture of the unmodified model (its bf16 arm)")
    p.add_argument("--json", action="store_true", help="also print the grades and the calibration as JSON")
    p.set_defaults(func=_cmd)
