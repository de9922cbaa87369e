"""``kvstudy capture relativize``: maintain capture folders."""

from __future__ import annotations

import argparse
from typing import Any

from kvstudy.capture import relativize_folder
from kvstudy.io import REPO_ROOT


def _relativize(args: argparse.Namespace) -> int:
    for folder in args.folders:
        changed = relativize_folder(folder, moved_from=args.moved_from)
        moved = f" and {args.moved_from} renamed to {folder}" if args.moved_from else ""
        print(f"{folder}: {len(changed)} file(s) rewritten without {REPO_ROOT}{moved}")
    return 0


def add_capture(subparsers: Any) -> None:
    parser = subparsers.add_parser("capture", help="maintain capture folders")
    sub = parser.add_subparsers(dest="capture_command", required=True)
    relativize = sub.add_parser("relativize", help="make absolute paths under the repository relative in text files")
    relativize.add_argument("folders", nargs="+", help="folders whose text files to rewrite")
    relativize.add_argument(
        "--moved-from",
        metavar="OLD",
        help="the folder's earlier path (e.g. data/captures/speed-cpu.new): paths under it are rewritten to the folder's",
    )
    relativize.set_defaults(func=_relativize)
