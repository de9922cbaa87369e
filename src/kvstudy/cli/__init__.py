"""The ``kvstudy`` command: one module per noun (``cli/model.py``, ``cli/speed.py``, ...), each adding
its sub-commands' parsers; the library below takes typed values, never a namespace."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from kvstudy.errors import StudyError

# module of kvstudy.cli -> its sub-commands (``kvstudy --help``'s order), each added by its ``add_<command>``.
# ``kvstudy COMMAND`` imports only its module and builds only its parser (scipy, statsmodels, pandas are
# imported inside the commands that need them). tests/unit/test_cli.py checks the table.
COMMANDS: dict[str, tuple[str, ...]] = {
    "model": ("capacity", "startup-log", "scales"),
    "speed": ("sweep", "speed"),
    "load": ("load",),
    "accuracy": ("gsm8k", "accuracy"),
    "capture": ("capture",),
    "report": ("render", "verdict", "design", "kv-calibrate", "profile"),
    "engine": ("engine-check",),
    "data": ("tiny-model", "checkpoints", "gsm8k-data", "train-model", "retrieval-data"),
    "context": ("roofline", "context-sweep"),
    "precision": ("control-checkpoint", "kv-simulate", "kv-screen"),
    "distribute": ("plan", "run-block", "collect", "run-blocks-ray"),
}
MODEL_HELP = "model folder, its config.json, or a cached Hugging Face id"
FORCE_HELP = "write into a folder this command did not create"
RETRY_HELP = "also re-run cells that failed before (their old logs are kept as *.attemptN.log)"


def json_option(parser: argparse.ArgumentParser, help: str | None = "print one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def force_option(parser: argparse.ArgumentParser, help: str = FORCE_HELP) -> None:
    parser.add_argument("--force", action="store_true", help=help)


def retry_option(parser: argparse.ArgumentParser, help: str | None = RETRY_HELP) -> None:
    parser.add_argument("--retry-failed", action="store_true", help=help)


def show(data: Any, lines: list[str], as_json: bool, **dumps: Any) -> None:
    """A command's result: ``data`` as one JSON object (``--json``), else ``lines``."""
    print(json.dumps(data, indent=2, **dumps) if as_json else "\n".join(lines))


def grid_command(
    subparsers: Any,
    name: str,
    help: str,
    spec: type[Any],
    run: Callable[[Any, argparse.Namespace, str], Sequence[Any]],
    plan: Callable[[Any, str], list[str]] = lambda spec, where: [],
) -> argparse.ArgumentParser:
    """``sweep``, ``load`` and ``context-sweep``: a JSON grid of ``spec`` run (or resumed) into a
    capture folder by ``run(spec, args, how)``; ``--dry-run`` prints ``plan(spec, where)`` and the
    cells to run. Exit 1 when a cell failed now or a failed one was kept."""
    from kvstudy.limits import output_folder  # not at the top: ``kvstudy engine-check`` needs no pydantic

    def main(args: argparse.Namespace) -> int:
        from kvstudy.bench.grid import cells_to_run, item_states
        from kvstudy.io import read_json

        grid = spec.from_dict(read_json(args.spec), where=args.spec)
        cells = grid.cells()
        todo = cells_to_run(args.capture, cells, args.retry_failed)
        if args.dry_run:
            lines = [*plan(grid, args.spec), *(c.id for c in todo), f"{len(todo)} of {len(cells)} cells to run"]
            print("\n".join(lines))
            return 0
        results = run(grid, args, f"kvstudy {name} {args.spec} {args.capture}")
        failed = [r for r in results if r.status != "ok"]
        for r in failed:
            print(f"failed: {r.cell_id}: {r.reason}", file=sys.stderr)
        states = item_states(args.capture, [c.id for c in cells])
        kept = [c for c, state in states.items() if state == "failed" and c not in {r.cell_id for r in results}]
        if kept:
            print(
                f"kept {len(kept)} cell(s) that failed before ({', '.join(kept[:5])}); re-run with --retry-failed",
                file=sys.stderr,
            )
        left = sum(state == "missing" for state in states.values())
        print(
            f"{len(results) - len(failed)} cells ok, {len(failed)} failed; {left} still to run; capture in {args.capture}"
        )
        return 1 if failed or kept else 0

    parser = subparsers.add_parser(name, help=help)
    parser.add_argument("spec", help=f"JSON file with the grid ({spec.__name__} fields)")
    parser.add_argument(
        "capture", type=output_folder, help="capture folder (created, or resumed if it holds the same grid)"
    )
    parser.add_argument("--dry-run", action="store_true", help="list the cells that would run, start nothing")
    retry_option(parser)
    parser.set_defaults(func=main)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are StudyErrors of one line (the sub-commands' parsers are of this class)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("kvstudy").strip()
        where = f"{command}: " if command else ""
        raise StudyError(f"{where}{' '.join(message.split())} (see {self.prog} --help)")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or, when ``argv`` starts with a known command, of that one only."""
    parser = _Parser(prog="kvstudy", description="FP8 KV-cache study helpers.")
    sub = parser.add_subparsers(dest="command", required=True)
    first = argv[0] if argv else None
    known = any(first in commands for commands in COMMANDS.values())
    for noun, commands in COMMANDS.items():
        for command in commands:
            if not known or command == first:
                getattr(importlib.import_module(f"kvstudy.cli.{noun}"), "add_" + command.replace("-", "_"))(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except StudyError as exc:
        print(f"kvstudy: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush writes nowhere
        return 0
    except OSError as exc:  # the filesystem refused a path a command was given (a last resort: one line)
        where = f"{str(exc.filename)[:200]}: " if exc.filename else ""
        print(f"kvstudy: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvstudy: interrupted", file=sys.stderr)
        return 130
