"""``kvstudy capacity``, ``kvstudy startup-log`` and ``kvstudy scales``: what a model holds, and what its
startup log and its checkpoint's KV scales say."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvstudy.cli import MODEL_HELP, force_option, json_option, show
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_GIB, MAX_TENSOR_PARALLEL, MAX_TOKENS, float_arg, int_arg, output_file
from kvstudy.model import plan
from kvstudy.model.capacity import KV_DTYPES
from kvstudy.model.log_check import check_log, format_check
from kvstudy.vllm.facts import DEFAULT_GPU_MEMORY_UTILIZATION
from kvstudy.vllm.startup_log import parse_startup_log, summary


def _capacity(args: argparse.Namespace) -> int:
    options = "assume tensor_parallel_size kv_dtype max_model_len skip_layers weights_gib gpu gpu_memory_gib"
    options += " gpu_memory_utilization allow_long_context"
    summary = plan.plan_summary(args.path, **{name: getattr(args, name) for name in options.split()})
    if args.csv:
        plan._csv(summary, args.csv, args.force)
    show(summary, [plan._format(summary)], args.json)
    return 0


def add_capacity(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="KV bytes per token and per request from a config.json",
        description="KV-cache capacity of a model (and, with --gpu, on a GPU)",
    )
    parser.add_argument("path", help=MODEL_HELP)
    parser.add_argument(
        "--kv-dtype",
        nargs="+",
        metavar="D",
        help=f"KV dtypes (default: the model's dtype, fp8, nvfp4); one of {', '.join(KV_DTYPES)}",
    )
    parser.add_argument(
        "--max-model-len",
        type=int_arg(1, MAX_TOKENS),
        help="tokens in one request (default: the config's max_position_embeddings)",
    )
    parser.add_argument("--skip-layers", help="'sliding_window' (or layer indices): layers kept in the model dtype")
    parser.add_argument(
        "--assume",
        metavar="FAMILY",
        help="override: read the config with a known family's rules, not vLLM's specs (the fields it ignores are printed)",
    )
    parser.add_argument("--gpu", metavar="NAME", help="a GPU from data/gpus/catalog.json (e.g. H100-SXM)")
    parser.add_argument("--gpu-memory-gib", type=float_arg(0.0, MAX_GIB), help="GPU memory in GiB (overrides --gpu's)")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float_arg(0.0, 1.0),
        help=f"vLLM --gpu-memory-utilization (default: vLLM's, {DEFAULT_GPU_MEMORY_UTILIZATION})",
    )
    parser.add_argument(
        "--weights-gib",
        type=float_arg(0.0, MAX_GIB),
        help="weights in GiB (default: the checkpoint's, else an estimate from the config)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int_arg(1, MAX_TENSOR_PARALLEL),
        default=1,
        metavar="N",
        help="GPUs in tensor parallelism",
    )
    parser.add_argument(
        "--allow-long-context",
        action="store_true",
        help="count a --max-model-len beyond the config's max_position_embeddings (vLLM needs VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
    )
    parser.add_argument("--csv", metavar="PATH", type=output_file, help="also write the per-dtype table as CSV at PATH")
    force_option(parser, "replace an existing --csv file")
    json_option(parser)
    parser.set_defaults(func=_capacity)


def _startup_log(args: argparse.Namespace) -> int:
    if args.model is None:
        info = parse_startup_log(Path(args.file))
        show(vars(info), [summary(info)], args.json)
        return 0
    result = check_log(args.file, args.model, args.any_name)
    show(result, [format_check(result)], args.json)
    return 0 if result["agree"] else 1


def add_startup_log(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "startup-log",
        help="parse a vLLM startup log; with --model, check its pool against the model",
        description="What a vLLM startup log says; with --model, whether the logged pool is the one the model "
        "and the logged KV memory give (exit 1 when not), and what each KV dtype would hold",
    )
    parser.add_argument("file", help="the server's log file")
    parser.add_argument("--model", help="the served model: a folder, its config.json, or a cache id")
    parser.add_argument(
        "--any-name", action="store_true", help="accept a log whose served model has another folder name"
    )
    json_option(parser)
    parser.set_defaults(func=_startup_log)


def _scales(args: argparse.Namespace) -> int:
    from kvstudy.model import scales  # numpy: only here

    if not args.models and not args.all_cache:
        raise StudyError("scales: give a model folder, a config.json or a cached id (or --all-cache)")
    reports = [scales.inspect_model(spec, log=args.log, cache_dir=args.cache_dir) for spec in args.models]
    if args.all_cache:
        reports += scales.inspect_cache(args.cache_dir)
        if not reports:
            raise StudyError(f"{args.cache_dir or 'the Hugging Face cache'}: no model repositories cached")
    for report in reports:
        for error in report.errors:
            print(f"kvstudy: {error}", file=sys.stderr)
    payload = [r.to_dict() for r in reports] if len(reports) != 1 else reports[0].to_dict()
    show(payload, ["\n\n".join(scales.summary(r) for r in reports)], args.json)
    return 2 if any(not r.readable or r.files_unread for r in reports) else 0


def add_scales(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "scales", help="find a checkpoint's KV settings and KV scale tensors (reads only their bytes)"
    )
    parser.add_argument("models", nargs="*", metavar="PATH_OR_ID", help=MODEL_HELP)
    parser.add_argument("--log", help="a vLLM startup log or resolved-run record (JSON) to check the scales against")
    parser.add_argument(
        "--all-cache", action="store_true", help="also scan every model in the local Hugging Face cache"
    )
    parser.add_argument(
        "--cache-dir", help="the Hugging Face hub cache for ids and --all-cache (default: HF_HUB_CACHE)"
    )
    json_option(parser, "print the reports as JSON")
    parser.set_defaults(func=_scales)
