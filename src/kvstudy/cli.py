"""The ``kvstudy`` command. Each concern's module adds its own sub-command through ``register``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvstudy.errors import StudyError

# module name -> the sub-commands its ``register`` adds to argparse (each sets ``func`` on its parser).
# ``kvstudy COMMAND`` imports only COMMAND's module, so a command does not pay for the others' imports
# (scipy, statsmodels, pandas); ``kvstudy --help`` imports them all. tests/unit/test_cli.py checks the
# table against what each module registers.
SUBCOMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "kvstudy.model.plan": ("capacity",),
    "kvstudy.model.log_check": ("startup-log",),
    "kvstudy.model.scales": ("scales",),
    "kvstudy.speed.runner": ("sweep",),
    "kvstudy.speed.compare": ("speed",),
    "kvstudy.load.runner": ("load",),
    "kvstudy.accuracy.gsm8k_command": ("gsm8k",),
    "kvstudy.accuracy.cli": ("accuracy",),
    "kvstudy.capture": ("capture",),
    "kvstudy.report.render": ("render",),
    "kvstudy.report.decision": ("verdict",),
    "kvstudy.report.design": ("design",),
    "kvstudy.report.calibration": ("kv-calibrate",),
    "kvstudy.profile_new": ("profile",),
    "kvstudy.vllm.install_check": ("engine-check",),
    "kvstudy.tools.tiny_model": ("tiny-model",),
    "kvstudy.tools.checkpoints": ("checkpoints",),
    "kvstudy.tools.gsm8k_data": ("gsm8k-data",),
    "kvstudy.tools.train_model": ("train-model",),
    "kvstudy.tools.retrieval_files": ("retrieval-data",),
    "kvstudy.context.cli": ("context-sweep", "roofline"),
    "kvstudy.tools.scaled_k_checkpoint": ("control-checkpoint",),
    "kvstudy.precision.simulate": ("kv-simulate",),
    "kvstudy.precision.screen": ("kv-screen",),
    "kvstudy.distribute.cli": ("collect", "plan", "run-block", "run-blocks-ray"),
}


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
    only = [m for m, commands in SUBCOMMAND_MODULES.items() if first in commands]
    for name in only or SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
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


if __name__ == "__main__":
    sys.exit(main())
