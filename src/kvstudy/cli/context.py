"""``kvstudy roofline`` (bytes a decode step reads, predicted TPOT and FP8 speedup) and ``kvstudy context-sweep``."""

from __future__ import annotations

import argparse
from typing import Any

from kvstudy.cli import MODEL_HELP, grid_command, json_option, show
from kvstudy.context.spec import ContextSweepSpec
from kvstudy.context.sweep import measure_bandwidth, run_context_sweep
from kvstudy.formats import GIB
from kvstudy.limits import (
    MAX_BANDWIDTH_GB_S,
    MAX_FACTOR,
    MAX_GIB,
    MAX_GRID_CELLS,
    MAX_TOKENS,
    MAX_USERS,
    float_arg,
    int_arg,
)
from kvstudy.model.roofline import DEFAULT_BANDWIDTH_FACTOR, RooflineResult, roofline


def _format(result: RooflineResult) -> str:
    """A short table: one line per KV dtype, then the speedup and the assumptions."""
    origin = next((a.origin for a in result.assumptions if a.name == "bandwidth_gb_s"), "given")
    where = result.gpu if origin == "datasheet" else f"{result.gpu or 'this machine'} ({origin} bandwidth)"
    head = (
        f"{result.model} on {where}: context {result.context_len:,} tokens, "
        f"{result.users} user(s), {result.bandwidth_gb_s:,.0f} GB/s x {result.bandwidth_factor:g}"
    )
    columns = f"{'kv dtype':<12}{'GB/step':>10}{'KV share':>10}{'TPOT ms':>10}{'slope ms/tok':>14}"
    lines = [head, columns + f"{'KV>=weights from':>18}"]
    for name, step in result.steps.items():
        dom = result.kv_dominates_from_tokens[name]
        lines.append(
            f"{name:<12}{step.total_bytes / 1e9:>10.3f}{step.kv_share:>10.2%}"
            f"{result.predicted_tpot_ms[name]:>10.3f}{result.predicted_itl_slope_ms_per_token[name]:>14.3e}"
            f"{(f'{dom:,}' if dom else 'never'):>18}"
        )
    if result.fp8_speedup_pct is not None:
        lines.append(
            f"predicted FP8 speedup: {result.fp8_speedup_pct:+.2f} % ({result.fp8_dtype} vs "
            f"{result.baseline_dtype}); TPOT {result.fp8_tpot_reduction_pct:.2f} % shorter"
        )
    for a in result.assumptions:
        value = f"{a.value:,.4g}" if isinstance(a.value, (int, float)) else str(a.value)
        lines.append(f"  {a.name} = {value} {a.unit} [{a.origin}]")
    return "\n".join(lines)


def _roofline(args: argparse.Namespace) -> int:
    bandwidth, origin = args.bandwidth_gb_s, "given"
    if args.measure_bandwidth:
        bandwidth, origin = measure_bandwidth().best_gb_s, "measured"
    result = roofline(
        args.model,
        args.context,
        args.users,
        gpu=args.gpu,
        kv_dtypes=args.kv_dtype,
        bandwidth_factor=args.bandwidth_factor,
        bandwidth_gb_s=bandwidth,
        bandwidth_origin=origin,
        weights_bytes=None if args.weights_gib is None else int(args.weights_gib * GIB),
        skip_layers=args.skip_layers,
    )
    show(result.to_dict(), [_format(result)], args.json)
    return 0


def add_roofline(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "roofline",
        help="predicted bytes per decode step, TPOT and FP8 speedup on a GPU",
        description=(__doc__ or "").strip(),
    )
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--gpu", help="GPU name or alias from data/gpus/catalog.json")
    parser.add_argument("--context", type=int_arg(1, MAX_TOKENS), required=True, help="tokens each request holds")
    parser.add_argument("--users", type=int_arg(1, MAX_USERS), default=1, help="requests decoded together (default 1)")
    parser.add_argument(
        "--kv-dtype", nargs="+", metavar="D", help="KV dtypes (default: the model's 16-bit dtype and fp8)"
    )
    parser.add_argument(
        "--bandwidth-factor",
        type=float_arg(0.0, MAX_FACTOR),
        help=f"achievable / peak bandwidth (default {DEFAULT_BANDWIDTH_FACTOR}, assumed)",
    )
    parser.add_argument(
        "--bandwidth-gb-s",
        type=float_arg(0.0, MAX_BANDWIDTH_GB_S),
        help="peak bandwidth in GB/s instead of the catalog's",
    )
    parser.add_argument(
        "--measure-bandwidth",
        action="store_true",
        help="measure this machine's bandwidth with the STREAM-like probe and use it",
    )
    parser.add_argument(
        "--weights-gib",
        type=float_arg(0.0, MAX_GIB),
        help="total weight memory in GiB instead of the model folder's figure",
    )
    parser.add_argument("--skip-layers", help="'sliding_window' (or layer indices): layers kept in the model dtype")
    json_option(parser)
    parser.set_defaults(func=_roofline)


def add_context_sweep(subparsers: Any) -> None:
    """One user, a grid of input lengths, each KV arm; resumes an existing capture folder."""
    sweep = grid_command(
        subparsers,
        "context-sweep",
        "run (or resume) the live ITL-vs-context sweep described by a JSON spec",
        ContextSweepSpec,
        lambda spec, args, how: run_context_sweep(spec, args.capture, how, args.max_servers, args.retry_failed),
    )
    sweep.add_argument(
        "--max-servers",
        type=int_arg(0, MAX_GRID_CELLS),
        help="start at most this many servers in this run",
    )
