"""Sample the accelerator's clock in the background while a cell runs.

Timestamps use ``time.perf_counter()``: on Linux that is CLOCK_MONOTONIC, a system-wide clock,
and vLLM's benchmark client stamps each request's start with the same call in its own process,
so samples and requests share one time axis. Each sample also carries the wall clock.

On an NVIDIA GPU the sampler reads NVML (nvidia-ml-py): SM and memory clocks, power,
temperature and the clock-event (throttle) reasons. Elsewhere it reads the CPU's core frequency
and utilisation with psutil. The NVML reader is thin: the conversion of its raw values into a
:class:`ClockSample` is a pure function, tested with plain numbers.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import field
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

import psutil
from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from kvstudy.io import read_jsonl

S = TypeVar("S")

# NVML clock-event ("throttle") reason bits, nvml.h (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(config=ConfigDict(extra="forbid"))
class ClockSample:
    """One telemetry sample (numbers read as floats). ``clock_mhz`` is the SM clock on a GPU, the
    mean core clock on a CPU."""

    t_mono_s: float  # time.perf_counter() at the sample
    t_wall_s: float  # time.time() at the sample
    device: str  # "gpu0", "gpu1", ... or "cpu"
    clock_mhz: float | None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    clock_event_mask: int | None = None
    clock_event_reasons: list[str] = field(default_factory=list)
    util_pct: float | None = None
    mark: str | None = None  # "window_start" / "window_end" for the edge samples, else None


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the NVML clock-event reason bits set in ``mask`` (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def nvml_sample(
    t_mono_s: float,
    t_wall_s: float,
    index: int,
    sm_clock_mhz: int | None,
    mem_clock_mhz: int | None,
    power_mw: int | None,
    temperature_c: int | None,
    reasons_mask: int | None,
    util_pct: int | None = None,
) -> ClockSample:
    """A sample from NVML's raw values (power in milliwatts, as NVML reports it)."""
    return ClockSample(
        t_mono_s=t_mono_s,
        t_wall_s=t_wall_s,
        device=f"gpu{index}",
        clock_mhz=sm_clock_mhz,
        mem_clock_mhz=mem_clock_mhz,
        power_w=None if power_mw is None else power_mw / 1000.0,
        temperature_c=temperature_c,
        clock_event_mask=reasons_mask,
        clock_event_reasons=[] if reasons_mask is None else decode_clock_event_reasons(reasons_mask),
        util_pct=util_pct,
    )


def cpu_sample(
    t_mono_s: float, t_wall_s: float, core_mhz: Sequence[float], util_pct: float | None = None
) -> ClockSample:
    """A sample from per-core frequencies (their mean is the clock)."""
    clocks = [float(f) for f in core_mhz if f]
    return ClockSample(
        t_mono_s=t_mono_s,
        t_wall_s=t_wall_s,
        device="cpu",
        clock_mhz=sum(clocks) / len(clocks) if clocks else None,
        util_pct=util_pct,
    )


class Reader(Protocol):
    def read(self) -> ClockSample: ...


class CpuReader:
    """Core frequency (psutil: sysfs cpufreq, else /proc/cpuinfo) and CPU utilisation."""

    def __init__(self) -> None:
        psutil.cpu_percent(None)  # primes the utilisation counter

    def read(self) -> ClockSample:
        freqs = psutil.cpu_freq(percpu=True) or []
        return cpu_sample(time.perf_counter(), time.time(), [f.current for f in freqs], psutil.cpu_percent(None))


class NvmlReader:
    """One NVIDIA GPU through NVML. Not exercised on machines without a GPU."""

    def __init__(self, index: int = 0) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nv = pynvml
        self.index = index
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._reasons = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def _try(self, fn, *args):  # a field the GPU does not report stays None
        try:
            return fn(self._handle, *args)
        except self._nv.NVMLError:
            return None

    def read(self) -> ClockSample:
        nv = self._nv
        util = self._try(nv.nvmlDeviceGetUtilizationRates)
        return nvml_sample(
            time.perf_counter(),
            time.time(),
            self.index,
            self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            self._try(nv.nvmlDeviceGetPowerUsage),
            self._try(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            self._try(self._reasons),
            None if util is None else util.gpu,
        )


def default_reader(gpu_index: int = 0) -> Reader:
    """NVML when an NVIDIA GPU answers, the CPU otherwise."""
    with suppress(Exception):  # no driver, no library, no such device: fall back to the CPU
        return NvmlReader(gpu_index)
    return CpuReader()


WINDOW_START = "window_start"
WINDOW_END = "window_end"


class Sampler(Generic[S]):
    """A background thread that calls ``read()`` every ``interval_s`` seconds and keeps what it
    answers (None: nothing to keep). ``with Sampler(read) as sampler: ...`` then ``sampler.samples``,
    kept in ``telemetry/<cell><suffix>.jsonl``."""

    suffix = ""

    def __init__(self, read: Callable[[], S | None], interval_s: float) -> None:
        self.read = read
        self.interval_s = interval_s
        self.samples: list[S] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> S | None:
        try:
            return self.read()
        except Exception as exc:  # keep sampling; say what failed
            if len(self.errors) < 10:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return None

    def _loop(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            if (sample := self._read()) is not None:
                self.samples.append(sample)
            next_t = max(next_t + self.interval_s, time.perf_counter())
            self._stop.wait(next_t - time.perf_counter())

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._loop, name="kvstudy-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[S]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 5)
        return self.samples

    def mark_end(self) -> None:
        """Called as the bench client exits (a clock sampler takes its closing edge sample)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TelemetrySampler(Sampler[ClockSample]):
    """The clock of ``reader`` (default: :func:`default_reader`) sampled in the background."""

    def __init__(self, reader: Reader | None = None, interval_s: float = 0.25) -> None:
        self.reader = reader or default_reader()
        super().__init__(self.reader.read, interval_s)

    def mark(self, label: str) -> None:
        """Take one sample now, outside the timer, labelled ``label`` (the runner marks each bench
        window's start and end this way, so a window shorter than the interval still holds samples)."""
        if (sample := self._read()) is not None:
            sample.mark = label
            self.samples.append(sample)

    def mark_end(self) -> None:
        self.mark(WINDOW_END)

    def window(self) -> tuple[float, float] | None:
        """(start, end) monotonic seconds of the last pair of edge samples, None when not both taken."""
        starts = [s.t_mono_s for s in self.samples if s.mark == WINDOW_START]
        ends = [s.t_mono_s for s in self.samples if s.mark == WINDOW_END]
        return (starts[-1], ends[-1]) if starts and ends and ends[-1] >= starts[-1] else None


def read_telemetry_jsonl(path: Path) -> list[ClockSample]:
    return read_jsonl(path, lambda row: ClockSample(**row), "a telemetry sample")


def window_clocks(
    samples: Sequence[ClockSample], start_s: float | None = None, end_s: float | None = None
) -> list[float]:
    """The ``clock_mhz`` readings of the samples inside [start_s, end_s] (monotonic seconds; None: open)."""
    return [
        s.clock_mhz
        for s in samples
        if s.clock_mhz is not None
        and (start_s is None or s.t_mono_s >= start_s)
        and (end_s is None or s.t_mono_s <= end_s)
    ]


def median_clock(
    samples: Sequence[ClockSample], start_s: float | None = None, end_s: float | None = None
) -> float | None:
    values = window_clocks(samples, start_s, end_s)
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- vLLM's /metrics

# Prometheus names vLLM 0.32 exports (vllm/v1/metrics/loggers.py): counters get "_total",
# histograms "_sum"/"_count". Values are summed over label sets (engines, models).
SERVER_METRICS = {
    "vllm:num_preemptions_total": "preemptions_total",  # counter
    "vllm:num_preemptions": "preemptions_total",  # the same, without the suffix
    "vllm:num_requests_waiting": "requests_waiting",  # gauge
    "vllm:num_requests_running": "requests_running",  # gauge
    "vllm:kv_cache_usage_perc": "kv_cache_usage",  # gauge, 0..1
    "vllm:request_queue_time_seconds_sum": "queue_time_s_sum",  # histogram: seconds queued, all requests
    "vllm:request_queue_time_seconds_count": "queue_time_count",
}


def parse_server_metrics(text: str) -> dict[str, float]:
    """The :data:`SERVER_METRICS` found in Prometheus text, summed over label sets (absent ones left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key = SERVER_METRICS.get(line.split("{", 1)[0].split(" ", 1)[0])  # comments and other names: None
        with suppress(IndexError, ValueError):
            if key is not None:
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape_server_metrics(base_url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """vLLM's /metrics read once; None when the server does not answer or exposes none of them."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return parse_server_metrics(text) or None


def metrics_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """What happened during a cell: preemptions and queueing (mean queue time per request)."""
    if not before or not after:
        return {}
    out: dict[str, float] = {}
    if "preemptions_total" in before and "preemptions_total" in after:
        out["preemptions"] = after["preemptions_total"] - before["preemptions_total"]
    n = after.get("queue_time_count", 0.0) - before.get("queue_time_count", 0.0)
    if n > 0:
        out["mean_queue_time_s"] = (after.get("queue_time_s_sum", 0.0) - before.get("queue_time_s_sum", 0.0)) / n
        out["requests_seen"] = n
    return out


class ServerMetricsSampler(Sampler[dict[str, float]]):
    """vLLM's /metrics read in the background while a cell runs: running and waiting requests, KV
    cache usage, preemptions (:data:`SERVER_METRICS`), each row stamped with ``time.perf_counter()``
    (the client's clock)."""

    suffix = ".metrics"

    def __init__(self, base_url: str, interval_s: float = 0.5, timeout_s: float = 2.0) -> None:
        def read() -> dict[str, float] | None:
            t0 = time.perf_counter()
            values = scrape_server_metrics(base_url, timeout_s)
            return {"t_mono_s": t0, "t_wall_s": time.time(), **values} if values else None

        super().__init__(read, interval_s)

    def peak(self, key: str) -> float | None:
        values = [r[key] for r in self.samples if key in r]
        return max(values) if values else None
