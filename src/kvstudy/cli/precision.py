"""``kvstudy control-checkpoint`` (the positive control), ``kv-simulate`` (FP8/int8 KV storage simulated
in PyTorch) and ``kv-screen`` (paired teacher-forced log p of two servers)."""

from __future__ import annotations

import argparse
from typing import Any

from kvstudy.bench.logprobs import DEFAULT_TOP_K
from kvstudy.cli import force_option, retry_option
from kvstudy.limits import MAX_FACTOR, MAX_ITEMS, MAX_THREADS, MAX_TOKENS, MAX_TOP_K, float_arg, int_arg, output_folder
from kvstudy.precision.records import load, scored_prompts, screen
from kvstudy.precision.simulate import LABEL, SimSpec, run
from kvstudy.tools.checkpoints import FACTOR, build_control


def _control_checkpoint(args: argparse.Namespace) -> int:
    record = build_control(args.source, args.out, args.factor, args.force, scales=not args.no_scales)
    scales = [round(s, 4) for s in record["k_scales"]] if record["k_scales"] else "none (FP8 at scale 1.0)"
    print(f"{args.out}: factor {record['factor']:g}, k_scale per layer {scales}")
    return 0


def add_control_checkpoint(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "control-checkpoint",
        help="write the KV-precision positive control: a Qwen3 checkpoint whose K overflows FP8 at scale 1.0",
    )
    p.add_argument("source", help="a single-file Qwen3 model folder (e.g. data/trained-model/qwen3-mini)")
    p.add_argument("out", type=output_folder, help="the folder to write")
    p.add_argument(
        "--factor",
        type=float_arg(1e-6, MAX_FACTOR),
        default=FACTOR,
        help="k_norm is multiplied and q_norm divided by it",
    )
    p.add_argument("--no-scales", action="store_true", help="write no KV scales: vLLM serves FP8 KV at scale 1.0")
    force_option(p)
    p.set_defaults(func=_control_checkpoint)


def _kv_simulate(args: argparse.Namespace) -> int:
    spec = SimSpec.from_dict({k: v for k, v in vars(args).items() if k in SimSpec.model_fields}, "kv-simulate")
    run(spec, args.capture, args.force, args.retry_failed)
    print(f"{args.capture}: done ({LABEL})")
    return 0


def add_kv_simulate(subparsers: Any) -> None:
    d = SimSpec()
    p = subparsers.add_parser("kv-simulate", help=f"score FP8/int8 KV storage in PyTorch ({LABEL})")
    p.add_argument("capture", type=output_folder, help="capture folder to write or resume")
    p.add_argument("--model", default=d.model)
    p.add_argument(
        "--control-dir", type=output_folder, default=d.control_dir, help=SimSpec.model_fields["control_dir"].description
    )
    p.add_argument("--retrieval-lengths", type=int_arg(1, MAX_TOKENS), nargs="+", default=list(d.retrieval_lengths))
    for name in ("gsm8k_n", "control_gsm8k_n", "retrieval_per_length", "greedy_n"):
        field = SimSpec.model_fields[name]
        p.add_argument(
            f"--{name.replace('_', '-')}", type=int_arg(0, MAX_ITEMS), default=field.default, help=field.description
        )
    p.add_argument("--threads", type=int_arg(1, MAX_THREADS), default=d.threads)
    force_option(p, "write into a folder kv-simulate did not create")
    retry_option(p, "run arms that failed before again")
    p.set_defaults(func=_kv_simulate)


def _kv_screen(args: argparse.Namespace) -> int:
    from kvstudy.precision.analysis import comparison_table, comparisons  # pandas: only when it runs

    prompts = scored_prompts(
        args.gsm8k_n, args.retrieval_lengths, args.retrieval_per_length, chars_per_token=args.chars_per_token
    )
    capture = screen(
        args.baseline,
        args.candidate,
        args.capture,
        prompts,
        args.repeat,
        args.allow_other_checkpoint,
        force=args.force,
        top_k=args.top_k,
    )
    table = comparison_table(comparisons(load(capture)))
    print(table.drop(columns=["storage"]).to_string(index=False))
    return 0


def add_kv_screen(subparsers: Any) -> None:
    p = subparsers.add_parser("kv-screen", help="paired teacher-forced log p of two OpenAI-compatible servers")
    p.add_argument("--baseline", required=True, help="URL of the 16-bit server, e.g. http://127.0.0.1:8000")
    p.add_argument("--candidate", required=True, help="URL of the server under test (e.g. FP8 KV)")
    p.add_argument("--repeat", help="URL of a second 16-bit server for the A/A floor (default: the baseline again)")
    p.add_argument("--capture", required=True, type=output_folder, help="capture folder to write")
    p.add_argument("--gsm8k-n", type=int_arg(0, MAX_ITEMS), default=20)
    p.add_argument("--retrieval-lengths", type=int_arg(1, MAX_TOKENS), nargs="*", default=[512, 1024, 2048])
    p.add_argument("--retrieval-per-length", type=int_arg(0, MAX_ITEMS), default=4)
    p.add_argument(
        "--chars-per-token",
        type=float_arg(0.01, MAX_FACTOR),
        default=1.0,
        help="retrieval context characters per token",
    )
    p.add_argument(
        "--top-k",
        type=int_arg(1, MAX_TOP_K),
        default=DEFAULT_TOP_K,
        help="log-probabilities per position for the KL (at most the servers' --max-logprobs)",
    )
    p.add_argument("--allow-other-checkpoint", action="store_true", help="the servers may load different folders")
    force_option(p, "write into a folder kv-screen did not create")
    p.set_defaults(func=_kv_screen)
