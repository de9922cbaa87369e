"""``kvstudy render``, ``verdict``, ``design``, ``kv-calibrate`` and ``profile new``: the reports, the
decision card, what a decision needs, the KL margin and a new profile."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
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


def _share(high: float, below: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number above 0 and at most ``high`` (``below`` it)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan  # refused below, as NaN and infinities are
        if not 0 < value <= high or (below and value == high):
            span = f"below {high:g}" if below else f"at most {high:g}"
            raise argparse.ArgumentTypeError(f"expected a number above 0, {span}, got {text[:40]!r}")
        return value

    return parse


def _at_most(values: list[float] | None, option: str) -> list[float] | None:
    from kvstudy.limits import MAX_DESIGN_VALUES

    if values is not None and len(values) > MAX_DESIGN_VALUES:
        raise StudyError(f"{option}: {len(values):,} values, expected at most {MAX_DESIGN_VALUES}")
    return values


def _design_runs(args: argparse.Namespace) -> int:
    """``design speed`` and ``design load``: the seed blocks per arm a change needs."""
    from kvstudy.report import design

    rows = design.runs_design(args.what, _at_most(args.change, "--change"), args.capture, args.noise_sd, args.power)
    lines = design.speed_lines(rows) if args.what == "speed" else design.load_lines(rows)
    show([asdict(r) for r in rows], lines, args.json, default=lambda v: None)
    return 0


def _design_accuracy(args: argparse.Namespace) -> int:
    from kvstudy.report.design import DEFAULT_MARGINS_POINTS, accuracy_design, accuracy_lines

    margins = _at_most(args.margin_points, "--margin-points") or DEFAULT_MARGINS_POINTS
    rows = accuracy_design(margins, args.discordance, args.totals, args.power)
    show([asdict(r) for r in rows], accuracy_lines(rows), args.json, default=lambda v: None)
    return 0


def add_design(subparsers: Any) -> None:
    from kvstudy.limits import DESIGN_CHANGE_PCT, DESIGN_MARGIN_POINTS, MAX_LOG_SD, float_arg
    from kvstudy.report import design
    from kvstudy.stats.binary import TARGET_POWER

    parser = subparsers.add_parser(
        "design",
        help="the runs or questions a decision needs (speed: runs per arm; accuracy: questions)",
        description=design.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="what", required=True)
    change, noise = float_arg(*DESIGN_CHANGE_PCT), _share(MAX_LOG_SD)
    runs = {
        "speed": ("TPOT", "speed-sweep", "seed log TPOT"),
        "load": ("users within the target", "load", "block log users"),
    }
    parsers = []
    for name, (changed, capture, per) in runs.items():
        default = " ".join(f"{c:g}" for c in design.DEFAULT_CHANGES_PCT[name])
        what = sub.add_parser(name, help=f"seed blocks per arm a change in {changed} needs at 80 %% power")
        what.add_argument("--capture", help=f"a {capture} capture folder with an A/A repeat of the baseline")
        what.add_argument("--noise-sd", type=noise, help=f"SD of a per-{per} difference (instead of a capture)")
        what.add_argument("--change", nargs="+", type=change, help=f"changes in {changed}, in %% (default {default})")
        parsers.append((what, _design_runs))
    acc = sub.add_parser("accuracy", help="questions a non-inferiority margin needs at 80 %% power")
    acc.add_argument(
        "--margin-points", nargs="+", type=float_arg(*DESIGN_MARGIN_POINTS), help="margins in points (default 1 2 5)"
    )
    acc.add_argument(
        "--discordance", type=_share(1.0), help="share of questions the two configurations disagree on, e.g. 0.05"
    )
    acc.add_argument(
        "--totals", nargs=3, type=int, metavar=("N", "BASE", "CAND"), help="published totals: questions, correct"
    )
    for what, func in [*parsers, (acc, _design_accuracy)]:
        what.add_argument("--power", type=_share(1.0, below=True), default=TARGET_POWER, help="power (default 0.8)")
        json_option(what, None)
        what.set_defaults(func=func)


def _calibrate(args: argparse.Namespace) -> int:
    from kvstudy.io import bounded_float
    from kvstudy.limits import MAX_FACTOR
    from kvstudy.precision.analysis import calibrate
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
    from kvstudy.profiles import write_profile

    path = write_profile(args.name, args.model, args.gpu, force=args.force)
    print(
        f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}; "
        f"render it with: make all PROFILE={args.name}"
    )
    return 0


def add_profile(subparsers: Any) -> None:
    from kvstudy.profiles import write_profile

    parser = subparsers.add_parser(
        "profile",
        help="write a profile for your model",
        description=write_profile.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="profile_command", required=True)
    new = sub.add_parser("new", help="write profiles/NAME.yaml for a model (and a GPU from the catalog)")
    new.add_argument("name", help="profile name (a file name without .yaml)")
    new.add_argument("--model", required=True, help="model folder, its config.json or a cached Hugging Face id")
    new.add_argument("--gpu", help="a GPU from data/gpus/catalog.json, e.g. H100-SXM or L4")
    force_option(new, "replace an existing profile")
    new.set_defaults(func=_profile)
