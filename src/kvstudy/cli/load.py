"""``kvstudy load``: run (or resume) a load-at-equal-memory sweep."""

from __future__ import annotations

from typing import Any

from kvstudy.cli import grid_command
from kvstudy.load.runner import run_load
from kvstudy.load.spec import LoadSpec, check_design


def _design(spec: LoadSpec, where: str) -> list[str]:
    """The dry run's check of the design: each arm's pool, then the ladder."""
    pools = check_design(spec, where=where).values()
    lines = [
        f"{p.arm}: {p.kv_cache_dtype}, {p.num_blocks:,} blocks, {p.tokens:,} tokens, {p.requests} requests fit"
        for p in pools
    ]
    return [*lines, f"ladder {spec.loads()}"]


def add_load(subparsers: Any) -> None:
    grid_command(
        subparsers,
        "load",
        "run (or resume) a load-at-equal-memory sweep described by a JSON grid",
        LoadSpec,
        lambda spec, args, how: run_load(spec, args.capture, how, retry_failed=args.retry_failed),
        _design,
    )
