"""What the study's GPU-only code reads on a real NVIDIA GPU, and two catalog figures checked there.

No vLLM is needed (the device machines this project is lent have none): the script runs the
parts that only a GPU exercises and prints what they report:

- ``kvstudy.machine.hardware_info`` (NVML): the GPU's name, memory, driver and CUDA version,
  and the catalog entry ``kvstudy.gpu_catalog.find_gpu`` matches to that name;
- memory: the driver's total (NVML, what ``nvidia-smi`` shows) against the catalog's
  ``memory_mib_driver``, and CUDA's own total (``torch.cuda.mem_get_info``, what vLLM multiplies
  by ``--gpu-memory-utilization``) beside it;
- ``kvstudy.bench.telemetry``: the NVML sampler while the GPU idles and while it runs bf16
  matrix products, with window marks as the speed runner takes them (samples in the window,
  median SM clock, clock-event reasons, power);
- bandwidth: the best device-to-device copy (bytes read + written per second, CUDA events)
  against the catalog's datasheet figure, the peak the roofline divides by.

    PYTHONPATH=src python3 benchmarks/gpu_check.py --out gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from kvstudy.bench import telemetry as tm
from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import find_gpu
from kvstudy.machine import hardware_info

MIB = 1 << 20


def memory_figures(index: int) -> dict[str, Any]:
    import pynvml
    import torch

    pynvml.nvmlInit()
    try:
        nvml_total = int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total)
    finally:
        pynvml.nvmlShutdown()
    free, cuda_total = torch.cuda.mem_get_info(index)
    return {
        "nvml_total_bytes": nvml_total,
        "nvml_total_mib": nvml_total / MIB,
        "cuda_total_bytes": int(cuda_total),
        "cuda_free_bytes": int(free),
        "cuda_minus_nvml_mib": (int(cuda_total) - nvml_total) / MIB,
    }


def clock_under_load(seconds: float, interval_s: float) -> dict[str, Any]:
    """The sampler through an idle second, a marked window of bf16 matrix products, an idle second."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    sampler = tm.TelemetrySampler(tm.default_reader(0), interval_s=interval_s).start()
    time.sleep(1.0)
    idle_end = time.perf_counter()
    sampler.mark(tm.WINDOW_START)
    products, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        products += 10
    busy_s = time.perf_counter() - start
    sampler.mark(tm.WINDOW_END)
    time.sleep(1.0)
    samples = sampler.stop()
    window = sampler.window()
    assert window is not None, "the window marks were not taken"
    inside = [s for s in samples if window[0] <= s.t_mono_s <= window[1]]
    return {
        "reader": type(sampler.reader).__name__,
        "samples": len(samples),
        "errors": sampler.errors,
        "idle_median_sm_mhz": tm.median_clock(samples, None, idle_end),
        "window_s": window[1] - window[0],
        "window_samples": len(tm.window_clocks(samples, *window)),
        "window_median_sm_mhz": tm.median_clock(samples, *window),
        "window_mem_clock_mhz": statistics.median(
            [s.mem_clock_mhz for s in inside if s.mem_clock_mhz is not None] or [0]
        ),
        "window_power_w": statistics.median([s.power_w for s in inside if s.power_w is not None] or [0]),
        "window_util_pct": statistics.median([s.util_pct for s in inside if s.util_pct is not None] or [0]),
        "clock_event_reasons_seen": sorted({r for s in samples for r in s.clock_event_reasons}),
        "matmul_tflop_s": 2 * n**3 * products / busy_s / 1e12,
    }


def copy_bandwidth(gib: float, repeats: int) -> dict[str, Any]:
    import torch

    size = int(gib * (1 << 30))
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return {
        "bytes_per_copy": size,
        "repeats": repeats,
        "best_gb_s": 2 * size / min(times) / 1e9,
        "median_gb_s": 2 * size / statistics.median(times) / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the figures as JSON here too")
    parser.add_argument("--load-seconds", type=float, default=6.0)
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--copy-gib", type=float, default=4.0)
    args = parser.parse_args(argv)

    info = hardware_info()
    if not info.gpus:
        print(f"gpu_check: no GPU read through NVML ({info.nvml_error}); run it on an NVIDIA GPU", file=sys.stderr)
        return 2
    gpu = info.gpus[0]
    try:
        spec = find_gpu(gpu.name)
    except StudyError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    figures: dict[str, Any] = {"hardware": asdict(info), "catalog_entry": spec.name}
    memory = memory_figures(gpu.index)
    memory["catalog_memory_mib_driver"] = spec.memory_mib_driver
    memory["nvml_matches_catalog"] = memory["nvml_total_bytes"] == spec.memory_mib_driver * MIB
    figures["memory"] = memory
    figures["clock"] = clock_under_load(args.load_seconds, args.interval_s)
    bandwidth = copy_bandwidth(args.copy_gib, 20)
    bandwidth["catalog_gb_s"] = spec.bandwidth_gb_s
    bandwidth["best_share_of_catalog"] = bandwidth["best_gb_s"] / spec.bandwidth_gb_s
    figures["bandwidth"] = bandwidth

    print(f"GPU: {gpu.name} (cc {gpu.compute_capability}), driver {info.gpu_driver}, CUDA {info.cuda_driver_version}")
    print(f"catalog entry: {spec.name}")
    print(
        f"memory: NVML {memory['nvml_total_mib']:.0f} MiB (catalog {spec.memory_mib_driver} MiB, "
        f"{'same' if memory['nvml_matches_catalog'] else 'DIFFERENT'}); CUDA total {memory['cuda_total_bytes']:,} B "
        f"({memory['cuda_minus_nvml_mib']:+.0f} MiB against NVML)"
    )
    clock = figures["clock"]
    print(
        f"telemetry ({clock['reader']}, every {args.interval_s} s): {clock['samples']} samples, errors {clock['errors']}; "
        f"idle SM {clock['idle_median_sm_mhz']} MHz; window {clock['window_s']:.1f} s with "
        f"{clock['window_samples']} samples, SM {clock['window_median_sm_mhz']} MHz, memory {clock['window_mem_clock_mhz']} MHz, "
        f"{clock['window_power_w']:.0f} W, util {clock['window_util_pct']} %; reasons seen {clock['clock_event_reasons_seen']}; "
        f"bf16 matmul {clock['matmul_tflop_s']:.0f} TFLOP/s"
    )
    print(
        f"copy bandwidth: best {bandwidth['best_gb_s']:.0f} GB/s, median {bandwidth['median_gb_s']:.0f} GB/s "
        f"= {bandwidth['best_share_of_catalog']:.1%} of the catalog's {spec.bandwidth_gb_s:.0f} GB/s"
    )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
