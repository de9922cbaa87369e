"""``kvstudy load``: run (or resume) a load-at-equal-memory sweep."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvstudy.bench.grid import cells_to_run
from kvstudy.cli import grid_arguments, print_failed, retry_option
from kvstudy.io import read_json
from kvstudy.load.runner import run_load
from kvstudy.load.spec import LoadSpec, check_design


def _load(args: argparse.Namespace) -> int:
    spec = LoadSpec.from_dict(read_json(Path(args.spec)), where=args.spec)
    if args.dry_run:
        pools = check_design(spec, where=args.spec)
        for p in pools.values():
            print(
                f"{p.arm}: {p.kv_cache_dtype}, {p.num_blocks:,} blocks, {p.tokens:,} tokens, {p.requests} requests fit"
            )
        todo = cells_to_run(args.capture, spec.cells())
        print(f"ladder {spec.loads()}; {len(todo)} of {len(spec.cells())} cells to run")
        return 0
    results = run_load(
        spec, args.capture, how=f"kvstudy load {args.spec} {args.capture}", retry_failed=args.retry_failed
    )
    failed = print_failed(results)
    print(f"{len(results) - len(failed)} cells ok, {len(failed)} failed; capture in {args.capture}")
    return 1 if failed else 0


def add_load(subparsers: Any) -> None:
    p = subparsers.add_parser("load", help="run (or resume) a load-at-equal-memory sweep described by a JSON grid")
    grid_arguments(p, "JSON file with the grid (LoadSpec fields)")
    p.add_argument("--dry-run", action="store_true", help="check the design and list the cells, start nothing")
    retry_option(p, "also re-run cells that failed before")
    p.set_defaults(func=_load)
