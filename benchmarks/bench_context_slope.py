"""Predicted vs measured ITL slope per arm of a context-sweep capture, as a ratio (printed, never asserted).

    .venv/bin/python benchmarks/bench_context_slope.py [CAPTURE] [--bandwidth-gb-s X | --measure-bandwidth]

CAPTURE defaults to the bundled ``data/captures/context-cpu``. The roofline's slope is fed the
bandwidth recorded in the capture (measured on the capture's machine by kvstudy.context.sweep.measure_bandwidth),
or one given, or one measured now. A slope whose 95 % interval includes 0 is printed as not resolved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvstudy.context.sweep import analyse_capture, slope_table
from kvstudy.errors import StudyError
from kvstudy.report.tables import slope_interval

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("capture", nargs="?", default=str(ROOT / "data" / "captures" / "context-cpu"))
    parser.add_argument("--bandwidth-gb-s", type=float, default=None)
    parser.add_argument("--measure-bandwidth", action="store_true")
    parser.add_argument("--boot", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        analysis = analyse_capture(args.capture, n_boot=args.boot)
        bw, origin = args.bandwidth_gb_s, "given"
        if args.measure_bandwidth:
            from kvstudy.context.sweep import measure_bandwidth

            bw, origin = measure_bandwidth().best_gb_s, "measured now"
        elif bw is None:
            origin = "measured at capture time"
        table = slope_table(analysis, bw, origin)
    except StudyError as exc:
        print(f"bench_context_slope: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"capture {args.capture}: model {analysis.spec.model}, lengths {list(analysis.spec.lengths)}, "
        f"seeds {list(analysis.spec.seeds)}, bandwidth ({origin}) = {table[0].bandwidth_gb_s:.2f} GB/s"
    )
    print(
        f"{'arm':<14}{'measured ms/token':>20}{'95 % interval':>26}{'predicted ms/token':>20}{'measured/predicted':>20}"
    )
    for row in table:
        if row.slope_ms is None:  # the arm was not measured
            print(f"{row.arm:<14}{'-':>20}{'':>26}{row.predicted_ms:>20.3e}{'-':>20}  {row.status}")
            continue
        print(
            f"{row.arm:<14}{row.slope_ms:>20.3e}{slope_interval(row.slope_ci):>26}"
            f"{row.predicted_ms:>20.3e}{row.ratio:>20.2f}  {row.status}"
        )
    for c in analysis.comparisons:
        print(c.statement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
