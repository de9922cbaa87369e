"""The load experiment: the CPU profile's section time, and one cell through the project beside a
plain `vllm bench serve` with the same settings against the same server.

Prints (1) the section's time from a load capture's recorded sessions (default: the bundled
data/captures/load-cpu, made with the CPU profile's grid), and (2) for one cell of the CPU profile's
grid (default: the 16-bit arm at its top load), the project's output throughput and TTFT p99 and
those of a plain `vllm bench serve` run with the same arguments (`--goodput` included), alternating
which goes first over ``--repeats`` pairs. Target: within 3 %.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_load_cell.py [--capture DIR] [--arm auto] [--users N] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep_cell import plain_vllm_bench  # noqa: E402  (the plain client, as the sweep benchmark runs it)

from kvstudy.io import read_json  # noqa: E402
from kvstudy.load.runner import run_cell  # noqa: E402
from kvstudy.load.spec import Cell, LoadSpec, Run  # noqa: E402
from kvstudy.vllm.server import VllmServer  # noqa: E402

TARGET_PCT = 3.0


def section_time(capture: Path) -> str:
    manifest = read_json(capture / "manifest.json")
    total = 0.0
    for s in manifest.get("sessions") or []:
        if s.get("started_utc") and s.get("finished_utc"):
            a, b = (
                dt.datetime.fromisoformat(str(s[k]).replace("Z", "+00:00")) for k in ("started_utc", "finished_utc")
            )
            total += (b - a).total_seconds()
    cells = len(list((capture / "cells").glob("*.json")))
    return f"{capture}: {cells} cells in {total / 60:.1f} min of recorded sessions"


def main() -> int:
    from kvstudy.profiles import load_profile

    grid = dict(load_profile("cpu", Path("profiles"))["notebooks"]["08_load-at-equal-memory"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", default="data/captures/load-cpu")
    ap.add_argument("--arm", default="auto")
    ap.add_argument("--users", type=int, default=None, help="offered load (default: the ladder's top)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if (Path(args.capture) / "manifest.json").is_file():
        print("section time:", section_time(Path(args.capture)))
    spec = LoadSpec.from_params(**{k: v for k, v in grid.items() if k in LoadSpec.__dataclass_fields__})
    cell = Cell(args.arm, spec.seeds[0], args.users or spec.loads()[-1])
    ours, plain = [], []
    with (
        tempfile.TemporaryDirectory() as tmp,
        VllmServer(spec.server_config(Run(args.arm, cell.seed)), Path(tmp) / "server.log") as server,
    ):
        for i in range(args.repeats):
            for side in ("ours", "plain") if i % 2 == 0 else ("plain", "ours"):
                if side == "ours":
                    res = run_cell(spec, Path(tmp) / f"cap{i}", cell, server, spec.model)
                    if res.status != "ok":
                        sys.exit(f"project cell failed: {res.reason}")
                    m = res.metrics or {}
                    ours.append((m["output_throughput_tok_s"], m["p99_ttft_ms"]))
                else:
                    data, how = plain_vllm_bench(
                        spec.bench_settings(cell), server.base_url, server.model_name, spec.model, Path(tmp)
                    )
                    plain.append((data["output_throughput"], data["p99_ttft_ms"]))
    for k, name in enumerate(("output throughput (tok/s)", "TTFT p99 (ms)")):
        a, b = statistics.median(x[k] for x in ours), statistics.median(x[k] for x in plain)
        diff = (a / b - 1) * 100
        print(
            f"{name}: project {a:.2f}, plain vllm bench serve {b:.2f} ({diff:+.2f} %; per repeat project "
            f"{[round(x[k], 2) for x in ours]}, plain {[round(x[k], 2) for x in plain]}); "
            f"{'within' if abs(diff) <= TARGET_PCT else 'NOT within'} {TARGET_PCT:g} %"
        )
    print(f"cell {cell.id}: {spec.requests_for(cell.concurrency)} requests, {args.repeats} repeats per side")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
