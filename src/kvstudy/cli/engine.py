"""``kvstudy engine-check``: is vLLM installed and importable here? (``make engine`` runs it)"""

from __future__ import annotations

import argparse
from typing import Any

from kvstudy.vllm.kv_specs import check


def _engine_check(args: argparse.Namespace) -> int:
    print(check())
    return 0


def add_engine_check(subparsers: Any) -> None:
    parser = subparsers.add_parser("engine-check", help="is vLLM installed and importable here?")
    parser.set_defaults(func=_engine_check)
