"""The ``kvstudy`` command. Each concern's module adds its own sub-command through ``register``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvstudy.errors import StudyError

# module name -> registers one sub-command with argparse; each sets ``func`` on its parser.
SUBCOMMAND_MODULES = (
    "kvstudy.model.plan",  # kvstudy capacity
    "kvstudy.model.log_check",  # kvstudy startup-log
    "kvstudy.model.scales",  # kvstudy scales
    "kvstudy.speed.runner",  # kvstudy sweep
    "kvstudy.speed.compare",  # kvstudy speed compare
    "kvstudy.load.runner",  # kvstudy load
    "kvstudy.accuracy.gsm8k_command",  # kvstudy gsm8k
    "kvstudy.accuracy.cli",  # kvstudy accuracy
    "kvstudy.capture",  # kvstudy capture upgrade
    "kvstudy.render",  # kvstudy render
    "kvstudy.decision",  # kvstudy verdict
    "kvstudy.report_design",  # kvstudy design
    "kvstudy.report_calibration",  # kvstudy kv-calibrate
    "kvstudy.profile_new",  # kvstudy profile new
    "kvstudy.vllm.install_check",  # kvstudy engine-check
    "kvstudy.tools.tiny_model",  # kvstudy tiny-model
    "kvstudy.tools.checkpoints",  # kvstudy checkpoints
    "kvstudy.tools.gsm8k_data",  # kvstudy gsm8k-data
    "kvstudy.tools.train_model",  # kvstudy train-model
    "kvstudy.tools.retrieval_files",  # kvstudy retrieval-data
    "kvstudy.context.cli",  # kvstudy roofline
    "kvstudy.tools.scaled_k_checkpoint",  # kvstudy control-checkpoint
    "kvstudy.precision.simulate",  # kvstudy kv-simulate
    "kvstudy.precision.screen",  # kvstudy kv-screen
    "kvstudy.distribute.cli",  # kvstudy plan, run-block, collect, run-blocks-ray
)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are StudyErrors of one line (the sub-commands' parsers are of this class)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("kvstudy").strip()
        where = f"{command}: " if command else ""
        raise StudyError(f"{where}{' '.join(message.split())} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvstudy", description="FP8 KV-cache study helpers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except StudyError as exc:
        print(f"kvstudy: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the filesystem refused a path a command was given (a last resort: one line)
        where = f"{str(exc.filename)[:200]}: " if exc.filename else ""
        print(f"kvstudy: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvstudy: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
