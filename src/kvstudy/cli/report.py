"""``kvstudy render``, ``verdict``, ``design``, ``kv-calibrate`` and ``profile new``: the reports, the
decision card, what a decision needs, the KL margin and a new profile."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from kvstudy.cli import force_option, json_option, show
from kvstudy.errors import StudyError
from kvstudy.report import decision


def _render(args: argparse.Namespace) -> int:
    from kvstudy.report.render import report_failures, run_profile

    return report_failures(run_profile(args.profile, only=args.only))


class _Once(argparse.Action):
    """An option that may be given once: a second ``--profile`` (smuggled in through ``ONLY=``) is refused."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if getattr(namespace, f"_{self.dest}_given", False):
            parser.error(f"{option_string} given twice; expected it once (notebook names go after --only)")
        setattr(namespace, f"_{self.dest}_given", True)
        setattr(namespace, self.dest, values)


def add_render(subparsers: Any) -> None:
    from kvstudy.report import render

    parser = subparsers.add_parser(
        "render",
        help="run a profile's notebooks and render the HTML reports",
        description=render.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile", default="reference", action=_Once, help="a file in profiles/ without .yaml (given once)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=(),
        help="run only these notebooks of the profile (the index keeps the others' last reports)",
    )
    parser.set_defaults(func=_render)


def _verdict(args: argparse.Namespace) -> int:
    card = decision.read_card(args.profile)
    print(decision.card_json(card) if args.json else decision.card_text(card))
    return 0


def add_verdict(subparsers: Any) -> None:
    parser = subparsers.add_parser("verdict", help="the decision card of a rendered profile")
    parser.add_argument("profile", help="a profile in profiles/ whose reports were rendered (make all PROFILE=...)")
    json_option(parser, "the card as JSON: the answer, the rule that fired, every input")
    parser.set_defaults(func=_verdict)


def _numbers(
    values: Sequence[str] | None, field: str, low: float = 0.0, high: float = math.inf, most: int = 1
) -> list[float] | None:
    """The numbers of option ``field``: at most ``most`` of them, each finite, above ``low`` (or equal
    to it when it is not 0) and at most ``high``; else one line naming the option and the bound."""
    if values is None:
        return None
    if len(values) > most:
        raise StudyError(f"{field}: {len(values):,} values, expected at most {most}")
    out = []
    for text in values:
        try:
            value = float(text)
        except ValueError:
            raise StudyError(f"{field}: expected a number, got {text[:40]!r}") from None
        if not math.isfinite(value) or value <= 0 or value < low or value > high:
            span = f"from {low:g} to {high:g}" if low > 0 else f"above 0, at most {high:g}"
            span = span if math.isfinite(high) else "above 0"
            raise StudyError(f"{field}: expected a number {span}, got {text[:40]!r}")
        out.append(value)
    return out


def _power(text: str) -> float:
    from kvstudy.stats.permutation import TARGET_POWER

    value = (_numbers([text], "--power") or [TARGET_POWER])[0]
    if not 0 < value < 1:
        raise StudyError(f"--power: expected a share in (0, 1), e.g. 0.8, got {text!r}")
    return value


def _design_runs(args: argparse.Namespace) -> int:
    """``design speed`` and ``design load``: the seed blocks per arm a change needs."""
    from kvstudy.limits import DESIGN_CHANGE_PCT, MAX_DESIGN_VALUES, MAX_LOG_SD
    from kvstudy.report import design

    sd = _numbers([args.noise_sd], "--noise-sd", high=MAX_LOG_SD) if args.noise_sd is not None else None
    changes = _numbers(args.change, "--change", *DESIGN_CHANGE_PCT, most=MAX_DESIGN_VALUES)
    noise, power = sd[0] if sd else None, _power(args.power)
    if args.what == "speed":
        rows = design.speed_design(changes or list(design.DEFAULT_CHANGES_PCT), args.capture, noise, power)
    else:
        rows = design.load_design(changes or [50.0, 100.0], args.capture, noise, power)
    lines = design.speed_lines(rows) if args.what == "speed" else design.load_lines(rows)
    show([asdict(r) for r in rows], lines, args.json, default=lambda v: None)
    return 0


def _design_accuracy(args: argparse.Namespace) -> int:
    from kvstudy.limits import DESIGN_MARGIN_POINTS, MAX_DESIGN_VALUES
    from kvstudy.report.design import DEFAULT_MARGINS_POINTS, accuracy_design, accuracy_lines

    psi = _numbers([args.discordance], "--discordance", high=1.0) if args.discordance is not None else None
    totals = None
    if args.totals is not None:
        try:
            totals = [int(t) for t in args.totals]
        except ValueError:
            raise StudyError(f"--totals: expected three whole numbers N BASE CAND, got {args.totals}") from None
    margins = _numbers(args.margin_points, "--margin-points", *DESIGN_MARGIN_POINTS, most=MAX_DESIGN_VALUES)
    margins = margins or list(DEFAULT_MARGINS_POINTS)
    rows = accuracy_design(margins, psi[0] if psi else None, totals, _power(args.power))
    show([asdict(r) for r in rows], accuracy_lines(rows), args.json, default=lambda v: None)
    return 0


def add_design(subparsers: Any) -> None:
    from kvstudy.report import design
    from kvstudy.stats.permutation import TARGET_POWER

    parser = subparsers.add_parser(
        "design",
        help="the runs or questions a decision needs (speed: runs per arm; accuracy: questions)",
        description=design.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="what", required=True)
    speed = sub.add_parser("speed", help="seed blocks per arm a TPOT change needs at 80 %% power")
    speed.add_argument("--capture", help="a speed-sweep capture folder with an A/A repeat of the baseline")
    speed.add_argument("--noise-sd", help="SD of a per-seed log TPOT difference (instead of a capture)")
    speed.add_argument("--change", nargs="+", help="TPOT changes in %% (default 5 10 20)")
    acc = sub.add_parser("accuracy", help="questions a non-inferiority margin needs at 80 %% power")
    acc.add_argument("--margin-points", nargs="+", help="margins in points (default 1 2 5)")
    acc.add_argument("--discordance", help="share of questions the two configurations disagree on, e.g. 0.05")
    acc.add_argument("--totals", nargs=3, metavar=("N", "BASE", "CAND"), help="published totals: questions, correct")
    ld = sub.add_parser("load", help="seed blocks per arm a change in users within the target needs at 80 %% power")
    ld.add_argument("--capture", help="a load capture folder with an A/A repeat of the baseline")
    ld.add_argument("--noise-sd", help="SD of a per-block log users difference (instead of a capture)")
    ld.add_argument("--change", nargs="+", help="changes in users within the target, in %% (default 50 100)")
    for what, func in ((speed, _design_runs), (acc, _design_accuracy), (ld, _design_runs)):
        what.add_argument("--power", default=str(TARGET_POWER), help="power (default 0.8)")
        json_option(what, None)
        what.set_defaults(func=func)


def _calibrate(args: argparse.Namespace) -> int:
    from kvstudy.io import bounded_float
    from kvstudy.limits import MAX_FACTOR
    from kvstudy.precision.divergence import calibrate
    from kvstudy.report.calibration import grade_from_captures, read_ladder

    if bool(args.ladder) == bool(args.grade):
        raise StudyError("kv-calibrate: expected either --grade (at least two) or --ladder, not both or neither")
    if args.ladder:
        bundle = read_ladder(args.ladder)
        ladders, calibrations, cal = bundle.grades, bundle.calibrations, bundle.margin
    else:
        factors = [bounded_float(f, "--grade FACTOR", 1.0, MAX_FACTOR) for f, _, _ in args.grade]
        ladder = [grade_from_captures(f, acc, scr, args.reference) for f, (_, acc, scr) in zip(factors, args.grade)]
        cal = calibrate(ladder)
        ladders, calibrations = {"accuracy": ladder}, {"accuracy": cal}
    for task, ladder in ladders.items():
        for g in ladder:
            print(
                f"{task} factor {g.factor:g}: accuracy {g.change_points:+.1f} points (95 % {g.change_low:+.1f} to "
                f"{g.change_high:+.1f}), KL {g.kl:.4g} nats/token, Δ log p {g.delta_logp:+.4g} nats/token"
            )
    if args.json:
        out = {
            t: {"grades": [asdict(g) for g in ladders[t]], "calibration": asdict(c)} for t, c in calibrations.items()
        }
        print(json.dumps(out, default=str))
    if cal.state != "calibrated":
        raise StudyError(f"control ladder: margin not calibrated: {cal.reason}")
    print(f"margin: {cal.state}; {cal.reason}; KL {cal.margin_kl:.4g} nats/token")
    return 0


def add_kv_calibrate(subparsers: Any) -> None:
    from kvstudy.report.calibration import LADDER_FILE

    p = subparsers.add_parser("kv-calibrate", help="the KL / Δ log p margin from a graded control through vLLM")
    p.add_argument(
        "--grade",
        nargs=3,
        action="append",
        metavar=("FACTOR", "ACCURACY_CAPTURE", "SCREEN_CAPTURE"),
        help="one grade: its factor, its accuracy capture (fp8-kv, and bf16 or --reference) and its kv-screen capture",
    )
    p.add_argument("--reference", help="accuracy capture of the unmodified model (its bf16 arm)")
    p.add_argument(
        "--ladder", help=f"a folder whose {LADDER_FILE} lists the grades (e.g. data/captures/kv-calibrate-cpu)"
    )
    json_option(p, "also print the grades and the calibration as JSON")
    p.set_defaults(func=_calibrate)


def _profile(args: argparse.Namespace) -> int:
    from kvstudy.io import REPO_ROOT
    from kvstudy.profile_new import write_profile

    path = write_profile(args.name, args.model, args.gpu, force=args.force)
    print(
        f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}; "
        f"render it with: make all PROFILE={args.name}"
    )
    return 0


def add_profile(subparsers: Any) -> None:
    from kvstudy import profile_new

    parser = subparsers.add_parser(
        "profile",
        help="write a profile for your model",
        description=profile_new.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="profile_command", required=True)
    new = sub.add_parser("new", help="write profiles/NAME.yaml for a model (and a GPU from the catalog)")
    new.add_argument("name", help="profile name (a file name without .yaml)")
    new.add_argument("--model", required=True, help="model folder, its config.json or a cached Hugging Face id")
    new.add_argument("--gpu", help="a GPU from data/gpus/catalog.json, e.g. H100-SXM or L4")
    force_option(new, "replace an existing profile")
    new.set_defaults(func=_profile)
