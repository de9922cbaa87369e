"""``kvstudy sweep`` (run or resume a speed sweep) and ``kvstudy speed compare`` (the verdict on two
folders of vLLM bench results)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from kvstudy.cli import grid_command, json_option
from kvstudy.limits import float_arg
from kvstudy.redact import redact, redact_text
from kvstudy.speed.runner import run_sweep
from kvstudy.speed.spec import SweepSpec


def add_sweep(subparsers: Any) -> None:
    grid_command(
        subparsers,
        "sweep",
        "run (or resume) a speed sweep described by a JSON grid",
        SweepSpec,
        lambda spec, args, how: run_sweep(spec, args.capture, how, retry_failed=args.retry_failed),
    )


def _compare(args: argparse.Namespace) -> int:
    from kvstudy.speed.compare import compare_folders, format_text

    result = compare_folders(args.base, args.cand, clock_tolerance=args.clock_tolerance_pct / 100.0)
    # a bench result's model_id or a folder name may carry a URL password or a token: never echoed
    if args.json:
        print(json.dumps(redact(asdict(result)), default=str, allow_nan=False))
    else:
        print(redact_text(format_text(result)))
    sys.stdout.flush()
    return 0


def add_speed(subparsers: Any) -> None:
    from kvstudy.speed import compare
    from kvstudy.speed.verdict import CLOCK_TOLERANCE

    parser = subparsers.add_parser("speed", help="speed verdicts on vLLM bench results")
    sub = parser.add_subparsers(dest="speed_command", required=True)
    cmp_parser = sub.add_parser(
        "compare",
        help="candidate vs baseline TPOT from two folders of vllm bench serve "
        "--save-result --save-detailed files (one run per file)",
        description=(compare.__doc__ or "").split("\n\n")[0],
    )
    cmp_parser.add_argument("base", metavar="BASE", help="folder of the baseline's result files")
    cmp_parser.add_argument("cand", metavar="CAND", help="folder of the candidate's result files")
    json_option(cmp_parser)
    cmp_parser.add_argument(
        "--clock-tolerance-pct",
        type=float_arg(0.0, 100.0),
        default=CLOCK_TOLERANCE * 100,
        metavar="X",
        help="largest difference of the arms' median clocks that still allows a claim "
        f"(default {CLOCK_TOLERANCE * 100:g})",
    )
    cmp_parser.set_defaults(func=_compare)
