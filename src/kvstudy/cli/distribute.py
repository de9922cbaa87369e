"""The sub-commands of the distributed study: ``plan``, ``run-block``, ``collect``, ``run-blocks-ray``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvstudy.cli import retry_option
from kvstudy.distribute.emit import EMITTERS, FILE_NAMES, check_values, emit
from kvstudy.limits import MAX_GRID_CELLS, MAX_THREADS, int_arg


def _cmd_plan(args: argparse.Namespace) -> int:
    from kvstudy.distribute.plan import make_plan

    out = Path(args.out)
    if args.emit:  # before the plan is written: a value no scheduler file can carry writes nothing
        check_values(store=args.store, out=str(out), image=args.image)
    plan_id, records, written = make_plan(
        args.profile, out, profiles_dir=Path(args.profiles) if args.profiles else None
    )
    for r in records:
        print(
            f"block {r['index']}: {r['block_id']} ({r['experiment']}, seed {r['seed']}, {len(r['server_starts'])} server starts)"
        )
    print(f"plan {plan_id}: {len(records)} blocks in {out / 'plan.jsonl'}" + ("" if written else " (unchanged)"))
    for path in emit(args.emit or [], out, plan_id, records, args.store, args.parallel, image=args.image):
        print(f"wrote {path}")
    return 0


def _cmd_run_block(args: argparse.Namespace) -> int:
    from kvstudy.distribute.block import run_block

    status = run_block(args.plan, args.index, args.store, retry_failed=args.retry_failed)
    print(f"block {args.index}: {status}; capture in {args.store}")
    return 0 if status == "ok" else 1


def _cmd_collect(args: argparse.Namespace) -> int:
    from kvstudy.distribute.collect import collect

    how = f"kvstudy collect {' '.join(args.stores)} --out {args.out}" + (" --partial" if args.partial else "")
    manifest = collect(args.stores, args.out, args.experiment, args.partial, how=how)
    info = manifest["collected"]
    missing = f"; missing {len(info['missing_blocks'])} block(s) (--partial)" if info["partial"] else ""
    print(
        f"{args.out}: {info['experiment']} capture of plan {info['plan_id']} from {len(manifest['blocks'])} block(s) "
        f"on {len(info['nodes'])} node(s){missing}"
    )
    return 0


def _cmd_ray(args: argparse.Namespace) -> int:
    from kvstudy.distribute.block import run_blocks_ray

    codes = run_blocks_ray(args.plan, args.store, args.index or None, args.address, args.num_cpus, args.retry_failed)
    bad = [i for i, c in codes.items() if c != 0]
    print(f"{len(codes) - len(bad)} of {len(codes)} blocks ok" + (f"; not ok: {bad}" if bad else ""))
    return 1 if bad else 0


def add_plan(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="write a profile's live experiments as content-hashed pair-blocks")
    p.add_argument("profile", help="profile name (profiles/NAME.yaml)")
    p.add_argument("--out", required=True, help="plan folder (plan.jsonl, plan.json and emitted files)")
    p.add_argument("--profiles", help="folder of profiles (default: the repository's profiles/)")
    p.add_argument("--emit", nargs="+", choices=EMITTERS, help="also write " + ", ".join(FILE_NAMES.values()))
    p.add_argument("--store", default="store", help="store the emitted jobs write blocks into (default: store)")
    p.add_argument(
        "--parallel",
        type=int_arg(1, MAX_GRID_CELLS),
        default=4,
        help="blocks at once (Slurm throttle, k8s parallelism)",
    )
    p.add_argument("--image", default="kvstudy:latest", help="container image of the k8s Job")
    p.set_defaults(func=_cmd_plan)


def add_run_block(subparsers: Any) -> None:
    r = subparsers.add_parser("run-block", help="run one block of a plan into a store (idempotent)")
    r.add_argument("plan", help="plan folder")
    r.add_argument("--index", type=int_arg(0, MAX_GRID_CELLS), required=True, help="block index (0-based)")
    r.add_argument("--store", required=True, help="store folder; the block's capture is STORE/<block-id>/")
    retry_option(r, "run a block that failed before again")
    r.set_defaults(func=_cmd_run_block)


def add_collect(subparsers: Any) -> None:
    c = subparsers.add_parser("collect", help="merge a plan's blocks into one capture the notebooks read")
    c.add_argument("stores", nargs="+", help="store folders")
    c.add_argument("--out", required=True, help="capture folder to write")
    c.add_argument("--experiment", help="speed or context, when the plan holds both")
    c.add_argument("--partial", action="store_true", help="collect without missing blocks (stated in the manifest)")
    c.set_defaults(func=_cmd_collect)


def add_run_blocks_ray(subparsers: Any) -> None:
    y = subparsers.add_parser("run-blocks-ray", help="run a plan's blocks as Ray tasks (where Ray is installed)")
    y.add_argument("plan", help="plan folder")
    y.add_argument("--store", required=True, help="store folder")
    y.add_argument("--index", type=int_arg(0, MAX_GRID_CELLS), action="append", help="only this block (repeatable)")
    y.add_argument("--address", help="Ray cluster address (default: start a local one)")
    y.add_argument("--num-cpus", type=int_arg(1, MAX_THREADS), help="CPUs of a local Ray cluster")
    retry_option(y, "run blocks that failed before again")
    y.set_defaults(func=_cmd_ray)
