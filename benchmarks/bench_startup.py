"""Start-to-ready time of kvstudy's runner against the same server started by hand.

"By hand" is a plain ``subprocess.Popen`` of the identical command line and environment, polled on
``GET /v1/models`` every 0.25 s, then killed. "Runner" is ``VllmServer(...).start()``, timed from
the call to its return (input checks, port choice, process start, readiness wait). The two kinds
alternate (A B B A ...) so a drift in machine load hits both. Prints every run, the medians and
the ratio runner / by hand (target: at most 1.1).

    .venv/bin/python benchmarks/bench_startup.py --runs 3 [--kv-cache-dtype auto] [--enforce-eager]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kvstudy.machine import vllm_distribution  # noqa: E402
from kvstudy.tools.tiny_model import ensure_tiny_model  # noqa: E402
from kvstudy.vllm.command import ServerConfig, build_command, server_environment  # noqa: E402
from kvstudy.vllm.process import stop_process_group  # noqa: E402
from kvstudy.vllm.server import VllmServer, free_port  # noqa: E402


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def by_hand(config: ServerConfig, log: Path, timeout_s: float) -> float:
    port = free_port()
    version = (vllm_distribution() or ("", None))[1]
    cmd = build_command(config, port, vllm_version=version)
    env = server_environment(config, vllm_version=version)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while not ready(f"http://127.0.0.1:{port}/v1/models"):
            if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"hand-started server failed; see {log}")
            time.sleep(0.25)
        return time.monotonic() - t0
    finally:
        stop_process_group(proc)


def with_runner(config: ServerConfig, log: Path, timeout_s: float) -> float:
    server = VllmServer(config, log, ready_timeout_s=timeout_s)
    t0 = time.monotonic()
    try:
        server.start()
        return time.monotonic() - t0
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="starts of each kind (default 3)")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--timeout", type=float, default=1500.0, help="readiness timeout per start, s")
    parser.add_argument("--out", default=str(ROOT / "captures" / "bench-startup"), help="logs and results folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = ensure_tiny_model(ROOT / "data" / "tiny-models" / "tiny-qwen3")
    config = ServerConfig(
        model=str(model),
        kv_cache_dtype=args.kv_cache_dtype,
        cpu_kvcache_space_gib=1,
        max_model_len=4096,
        enforce_eager=args.enforce_eager,
    )
    times: dict[str, list[float]] = {"runner": [], "by_hand": []}
    for i in range(args.runs):
        order = ("runner", "by_hand") if i % 2 == 0 else ("by_hand", "runner")
        for kind in order:
            log = out / f"{kind}-{i}.log"
            seconds = (with_runner if kind == "runner" else by_hand)(config, log, args.timeout)
            times[kind].append(seconds)
            print(f"run {i} {kind:8s} start-to-ready {seconds:7.1f} s  (log {log})", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["runner"] / med["by_hand"]
    print(
        f"median start-to-ready: runner {med['runner']:.1f} s, by hand {med['by_hand']:.1f} s, "
        f"ratio {ratio:.3f} (target <= 1.1) over {args.runs} runs each"
    )
    result = {
        "times_s": times,
        "median_s": med,
        "ratio": ratio,
        "config": config.to_dict(),
        "vllm": vllm_distribution(),
        "load_average": os.getloadavg(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(main())
