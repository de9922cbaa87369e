"""Replay and resample A/A speed captures: the speed verdict's false-claim rate and its power.

A/A runs are runs of one server configuration (no effect to find). Runs are grouped by workload
(concurrency, lengths, prompts, model); per group this prints

* each run's median TPOT, its seed (the block: read from the file name, ``<config>__s<seed>__...``)
  and whether per-token latency was measurable;
* the false-claim rate over the real splits (each seed's two A/A runs one to each pseudo-arm, at
  least 1,000 splits), or "calibration not possible with this design" when that design cannot reach
  p < 0.05 (3 seed blocks: smallest p 0.25);
* the false-claim rate of designs of N seed blocks per arm (default 6, the fewest that can reach
  p < 0.05) resampled from the group's blocks, with its 95 % Clopper-Pearson interval;
* the power to detect a 20 % TPOT change at N blocks per arm with its interval over the simulated
  designs, its range over the noise estimate's own 95 % interval (normal model, sign-flip test),
  and the change detected with 80 % power.

The rates count the verdict's test (p < 0.05 within seed blocks, and the 95 % interval excluding 1)
on every run, measurable or not: the other conditions can only turn a claim into "no claim".

By default it reads the bundled capture ``data/captures/speed-cpu`` (its ``bench/`` files of the
configurations ``auto`` and ``auto-repeat``, the same server configuration: an A/A pair pooled at
each user count). Figures only, no assertions.

    .venv/bin/python benchmarks/bench_aa_calibration.py [FOLDER ...] [--configs auto auto-repeat]
        [--splits 1000] [--runs-per-arm 6] [--change 0.2] [--seed 0]
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from pathlib import Path

from kvstudy.bench.measurability import assess_run
from kvstudy.bench.result import read_result_file, result_files
from kvstudy.speed.calibration import (
    false_claim_rate,
    minimum_detectable_change,
    noise_sensitivity,
    power,
)
from kvstudy.speed.compare import BenchRun, expected_output_len, run_from_result
from kvstudy.speed.verdict import summarise_run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CAPTURE = ROOT / "data" / "captures" / "speed-cpu"


def bench_files(folder: Path, configs: list[str] | None) -> list[Path]:
    """Result files of ``folder`` (or of its ``bench/`` subfolder), optionally only those whose name
    starts with ``<config>__`` for one of ``configs``."""
    source = folder / "bench" if (folder / "bench").is_dir() else folder
    files = result_files(source)
    if configs:
        files = [p for p in files if p.name.split("__")[0] in configs]
    return files


def group_runs(runs: list[BenchRun]) -> dict[tuple, list[BenchRun]]:
    """Runs grouped by workload: model, prompts, concurrency, rate, input and output length."""
    groups: dict[tuple, list[BenchRun]] = defaultdict(list)
    for r in runs:
        s = r.settings
        key = (
            s["max_concurrency"],
            s["num_prompts"],
            round(s["input_len"] or 0),
            s["output_len"],
            s["model_id"],
            s["request_rate"],
        )
        groups[key].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1:3])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help=f"A/A folders (default {DEFAULT_CAPTURE})")
    parser.add_argument(
        "--configs",
        nargs="*",
        default=None,
        help="file-name prefixes to keep (default for the bundled capture: auto auto-repeat)",
    )
    parser.add_argument("--splits", type=int, default=1000, help="pseudo-arm splits and simulated designs (>= 1000)")
    parser.add_argument("--runs-per-arm", type=int, default=6, help="seed blocks per arm for simulation and power")
    parser.add_argument("--change", type=float, default=0.2, help="true TPOT change for the power figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folders = args.folders or [DEFAULT_CAPTURE]
    configs = args.configs if args.configs is not None else (["auto", "auto-repeat"] if not args.folders else None)

    runs = [run_from_result(read_result_file(p), p) for f in folders for p in bench_files(f, configs)]
    print(
        f"A/A calibration of the speed verdict: {len(runs)} runs from {', '.join(map(str, folders))}"
        + (f" (configurations {', '.join(configs)})" if configs else "")
    )
    n = args.runs_per_arm
    for key, group in group_runs(runs).items():
        concurrency, prompts, input_len, output_len = key[:4]
        t0 = time.perf_counter()
        expected = expected_output_len(group)
        summaries = []
        print(f"\n== {concurrency} user(s), {prompts} prompts, ~{input_len} in / {output_len} out: {len(group)} runs")
        for r in group:
            m = assess_run(r.requests, r.name, expected_output_len=expected, duration_s=r.duration_s)
            seed = re.search(r"__s(\d+)", r.path.name)
            s = summarise_run(
                r.requests,
                m,
                start_time_s=r.start_time_s,
                median_clock_mhz=r.median_clock_mhz,
                block=int(seed.group(1)) if seed else None,
            )
            summaries.append(s)
            status = "measurable" if m.measurable else "NOT measurable: " + "; ".join(m.reasons)
            print(f"   {r.path.name:<28} seed {s.block}  median TPOT {s.median_tpot_s * 1e3:7.2f} ms  {status}")
        if len(summaries) < 2:
            print("   fewer than 2 runs: nothing to split")
            continue
        replay = false_claim_rate(summaries, splits=args.splits, seed=args.seed)
        kind = "seed blocks" if replay.blocked else "runs"
        print(f"   replay, real splits ({replay.n_base} vs {replay.n_cand} {kind}): {replay.text}")
        sim = power(summaries, change=0.0, n_per_arm=n, simulations=args.splits, seed=args.seed)
        print(
            f"   resampled, {n} vs {n} {'seed blocks' if sim.blocked else 'runs'}: false claims {sim.text} (target <= 5 %)"
        )
        pw = power(summaries, change=args.change, n_per_arm=n, simulations=args.splits, seed=args.seed)
        print(f"   power for a {args.change:+.0%} TPOT change at {n} per arm: {pw.text}")
        sens = noise_sensitivity(summaries, change=args.change, n_per_arm=n, seed=args.seed)
        print("   power across the noise estimate's uncertainty: " + (sens.text if sens else "not estimable"))
        mdc = minimum_detectable_change(summaries, n_per_arm=n, seed=args.seed)
        print(
            f"   change detected with 80 % power at {n} per arm: "
            + (f"{mdc:+.0%}" if mdc is not None else "none up to +300 %")
        )
        print(f"   ({time.perf_counter() - t0:.1f} s)")
    print(
        "\nNote: with few A/A runs per group the resampled noise model sees only those runs; "
        "the figures are as good as the spread they capture."
    )


if __name__ == "__main__":
    main()
