"""Predicted vs measured ITL slope per arm of a context-sweep capture, as a ratio (printed, never asserted).

    .venv/bin/python benchmarks/bench_context_slope.py [CAPTURE] [--bandwidth-gb-s X | --measure-bandwidth]

CAPTURE defaults to the bundled ``data/captures/context-cpu``. The roofline's slope is fed the
bandwidth recorded in the capture (measured on the capture's machine by kvstudy.context.bandwidth),
or one given, or one measured now. A slope whose 95 % interval includes 0 is printed as not resolved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvstudy.context.live import analyse_capture, slope_table
from kvstudy.errors import StudyError

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
            from kvstudy.context.bandwidth import measure_bandwidth

            bw, origin = measure_bandwidth().best_gb_s, "measured now"
        elif bw is None:
            origin = "measured at capture time"
        table = slope_table(analysis, bw, origin)
    except StudyError as exc:
        print(f"bench_context_slope: error: {exc}", file=sys.stderr)
        return 2
    bw_col = next(c for c in table.columns if c.startswith("bandwidth"))
    print(
        f"capture {args.capture}: model {analysis.spec.model}, lengths {list(analysis.spec.lengths)}, "
        f"seeds {list(analysis.spec.seeds)}, {bw_col} = {table[bw_col].iloc[0]:.2f} GB/s"
    )
    print(
        f"{'arm':<14}{'measured ms/token':>20}{'95 % interval':>26}{'predicted ms/token':>20}{'measured/predicted':>20}"
    )
    for _, row in table.iterrows():
        measured = row["measured slope (ms/token)"]
        if measured is None or measured != measured:  # None or NaN: the arm was not measured
            print(
                f"{row['arm']:<14}{'-':>20}{'':>26}{row['predicted slope (ms/token)']:>20.3e}{'-':>20}  {row['status']}"
            )
            continue
        ratio = row["measured / predicted"]
        print(
            f"{row['arm']:<14}{row['measured slope (ms/token)']:>20.3e}{row['95 % interval']:>26}"
            f"{row['predicted slope (ms/token)']:>20.3e}{ratio:>20.2f}  {row['status']}"
        )
    for c in analysis.comparisons:
        print(c.statement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
