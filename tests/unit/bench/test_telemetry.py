"""Unit tests of the clock sampler and of the NVML record conversion (plain values, no GPU)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvstudy.bench import telemetry as tm
from kvstudy.io import write_jsonl_atomic


def test_clock_event_reasons_decode() -> None:
    assert tm.decode_clock_event_reasons(0) == []
    assert tm.decode_clock_event_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert tm.decode_clock_event_reasons(0x1 | 0x1000) == ["gpu_idle", "unknown_0x1000"]


def test_nvml_values_convert_to_sample() -> None:
    s = tm.nvml_sample(5.0, 1700000000.0, 1, 1410, 7001, 72345, 81, 0x20, 97)
    assert (s.device, s.clock_mhz, s.mem_clock_mhz, s.temperature_c, s.util_pct) == ("gpu1", 1410.0, 7001.0, 81.0, 97.0)
    assert s.power_w == pytest.approx(72.345)
    assert s.clock_event_mask == 0x20 and s.clock_event_reasons == ["sw_thermal_slowdown"]
    empty = tm.nvml_sample(5.0, 0.0, 0, None, None, None, None, None)
    assert empty.clock_mhz is None and empty.power_w is None and empty.clock_event_reasons == []


def test_cpu_sample_averages_cores_and_skips_zero() -> None:
    s = tm.cpu_sample(1.0, 2.0, [2000.0, 3000.0, 0.0], 40.0)
    assert (s.device, s.clock_mhz, s.util_pct) == ("cpu", 2500.0, 40.0)
    assert tm.cpu_sample(1.0, 2.0, []).clock_mhz is None


class CountingReader:
    kind = "test"

    def __init__(self, fail_every: int = 0) -> None:
        self.n, self.fail_every = 0, fail_every

    def read(self) -> tm.ClockSample:
        self.n += 1
        if self.fail_every and self.n % self.fail_every == 0:
            raise RuntimeError("sensor busy")
        return tm.ClockSample(time.perf_counter(), time.time(), "test", 1000.0 + self.n)

    def close(self) -> None:
        pass


def test_sampler_samples_at_interval_and_survives_errors() -> None:
    with tm.TelemetrySampler(CountingReader(fail_every=3), interval_s=0.02) as sampler:
        time.sleep(0.5)
    n = len(sampler.samples)
    assert 10 <= n <= 26, n
    assert sampler.errors and sampler.errors[0] == "RuntimeError: sensor busy"
    times = [s.t_mono_s for s in sampler.samples]
    assert times == sorted(times)
    time.sleep(0.1)
    assert len(sampler.samples) == n  # stopped means stopped


def test_cpu_reader_uses_the_request_clock() -> None:
    before = time.perf_counter()
    s = tm.CpuReader().read()
    after = time.perf_counter()
    assert before <= s.t_mono_s <= after
    assert s.device == "cpu" and (s.clock_mhz is None or s.clock_mhz > 100)


def test_jsonl_round_trip_and_windowed_median(tmp_path: Path) -> None:
    samples = [tm.ClockSample(float(t), 0.0, "cpu", c) for t, c in [(0, 100.0), (1, 200.0), (2, 300.0), (3, 900.0)]]
    write_jsonl_atomic(tmp_path / "t.jsonl", samples)
    assert tm.read_telemetry_jsonl(tmp_path / "t.jsonl") == samples
    assert tm.median_clock(samples) == 250.0
    assert tm.median_clock(samples, 0.5, 2.5) == 250.0 and tm.median_clock(samples, 1, 2) == 250.0
    assert tm.median_clock(samples, 2.5, 3.0) == 900.0 and tm.median_clock(samples, 10, 11) is None


# --------------------------------------------------------------------------- edge samples, /metrics


class _FixedReader:
    kind = "cpu"

    def read(self) -> "tm.ClockSample":
        import time as _t

        return tm.cpu_sample(_t.perf_counter(), _t.time(), [1500.0])

    def close(self) -> None:
        return None


def test_mark_takes_labelled_edge_samples_outside_the_timer() -> None:
    sampler = tm.TelemetrySampler(_FixedReader(), interval_s=3600.0)
    with sampler:
        sampler.mark(tm.WINDOW_START)
        sampler.mark(tm.WINDOW_END)
    window = sampler.window()
    assert window is not None and window[0] <= window[1]
    assert tm.window_clocks(sampler.samples, *window) == [1500.0, 1500.0]
    assert tm.median_clock(sampler.samples, *window) == 1500.0


def test_window_is_none_without_both_edges() -> None:
    sampler = tm.TelemetrySampler(_FixedReader(), interval_s=3600.0)
    sampler.mark(tm.WINDOW_START)
    assert sampler.window() is None


PROMETHEUS = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.5
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:generation_tokens_total{engine="0",model_name="m"} 999.0
"""


def test_parse_server_metrics_reads_queue_and_preemptions() -> None:
    got = tm.parse_server_metrics(PROMETHEUS)
    assert got == {
        "preemptions_total": 3.0,
        "requests_waiting": 2.0,
        "requests_running": 5.0,
        "queue_time_s_sum": 1.5,
        "queue_time_count": 10.0,
    }


def test_metrics_delta_gives_preemptions_and_mean_queue_time_of_the_cell() -> None:
    before = {"preemptions_total": 3.0, "queue_time_s_sum": 1.5, "queue_time_count": 10.0}
    after = {"preemptions_total": 7.0, "queue_time_s_sum": 3.5, "queue_time_count": 14.0}
    assert tm.metrics_delta(before, after) == {"preemptions": 4.0, "mean_queue_time_s": 0.5, "requests_seen": 4.0}
    assert tm.metrics_delta(None, after) == {}


def test_scrape_server_metrics_of_no_server_is_none() -> None:
    assert tm.scrape_server_metrics("http://127.0.0.1:1", timeout_s=1.0) is None
