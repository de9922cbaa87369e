"""Time the reference profile (what `make all` runs) per notebook; target: under 60 s in all.

Run with the environment already set up: `make bench` or `.venv/bin/python benchmarks/bench_reports.py`.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvstudy.report.render import run_profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="reference")
    parser.add_argument("--target-s", type=float, default=60.0)
    args = parser.parse_args()
    start = time.perf_counter()
    runs = run_profile(args.profile)
    total = time.perf_counter() - start
    print(f"\n{'notebook':32s} {'seconds':>8s}  status")
    for run in runs:
        print(f"{run.name:32s} {run.seconds:8.1f}  {'FAILED' if run.error else 'ok'}")
    verdict = "within" if total <= args.target_s else "OVER"
    print(f"{'total (incl. HTML and index)':32s} {total:8.1f}  {verdict} the {args.target_s:.0f} s target")
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
