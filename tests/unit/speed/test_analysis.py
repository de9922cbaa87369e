"""Unit tests of the speed analysis: tables, seed ranges, verdicts, the OLS estimate, loading."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pandas as pd
import pytest

from kvstudy.bench.grid import write_record
from kvstudy.bench.result import RequestRecord
from kvstudy.bench.telemetry import ClockSample
from kvstudy.errors import StudyError
from kvstudy.io import write_jsonl_atomic
from kvstudy.report.tables import (
    ADMISSION,
    PUBLISHED_VERDICTS,
    SPEED_VERDICT_DESIGN,
    SPEED_VERDICT_MAIN,
    SPEED_VERDICTS,
    render,
)
from kvstudy.speed import analysis as speed
from kvstudy.speed import runner as sweep
from kvstudy.speed import verdicts_table as vt

PUBLISHED = Path(__file__).resolve().parents[3] / "data" / "published" / "l4-speed-qwen3-8b.json"


def seeds_frame(rows: list[tuple[int, str, int, float, float, float]]) -> pd.DataFrame:
    """(users, configuration, seed, median_tpot_ms, output tok/s, clock MHz) rows."""
    return pd.DataFrame(
        [
            {
                "users": u,
                "configuration": c,
                "kv_cache_dtype": "fp8" if c == "fp8" else "auto",
                "seed": s,
                "median_tpot_ms": t,
                "output_throughput_tok_s": tps,
                "median_clock_mhz": clk,
            }
            for u, c, s, t, tps, clk in rows
        ]
    )


# --------------------------------------------------------------------------- published table


def test_published_table_is_read_as_printed() -> None:
    pub = speed.load_published(PUBLISHED)
    t = pub.table.set_index(["users", "configuration"])
    assert t.loc[(1, "bf16"), "median_tpot_ms"] == 104.1 and t.loc[(1, "fp8"), "median_tpot_ms"] == 101.8
    assert t.loc[(32, "fp8"), "output_throughput_tok_s"] == 192.0
    assert t.loc[(32, "bf16"), "median_clock_mhz"] == 450 and t.loc[(32, "fp8"), "seeds"] == 2
    assert pub.meta["pool_tokens"] == 24096 and pub.meta["vllm_version"] == "0.31.0"
    assert t["tpot_min_ms"].isna().all()  # per-seed values were not published: nothing invented
    assert any("per-seed" in item for item in pub.not_published)


def test_published_table_restated_under_the_new_rule() -> None:
    pub = speed.load_published(PUBLISHED)
    rows = vt.published_verdicts(pub, 1152)
    assert [r.users for r in rows] == [1, 32] and rows[0].min_p_value == pytest.approx(0.2)
    t = render(rows, PUBLISHED_VERDICTS).set_index("users")
    assert t.loc[1, "change"] == "faster by 2.2 %"  # 101.8 / 104.1 = 0.978
    assert t.loc[1, "min reachable p"] == "0.2"  # 2 / C(5, 2): 3 vs 2 seeds
    assert "cannot reach significance" in t.loc[1, "why"]
    assert (t["verdict (new rule)"] == "no claim").all()
    assert t.loc[32, "cycles per token (cand/base)"] == "more by 3.2 %"  # 138.0 x 480 vs 142.7 x 450
    assert "clocks differ by +6.7%" in t.loc[32, "why"]
    bound = float(t.loc[1, "roofline bound (% less time, 1152 tokens assumed)"])
    # the old "another factor changed" rested on an assumed length the published tok/s x TPOT contradicts
    assert 0.3 < bound < 1.0 and t.loc[1, "against the bound"].startswith("no claim: the request length")


def test_sign_convention_and_bound_wording() -> None:
    assert vt.change_text(0.9) == "faster by 10.0 %" and vt.change_text(1.25) == "slower by 25.0 %"
    assert vt.bound_less_time_pct(100.0) == pytest.approx(50.0)  # twice as fast = half the time
    assert vt.beyond_bound(0.9, (0.85, 0.95), 1.0).startswith("another factor changed")
    assert vt.beyond_bound(0.9, (0.85, 1.05), 1.0).startswith("within reach")  # interval reaches the bound
    assert vt.beyond_bound(0.995, None, 1.0).startswith("within reach")
    assert vt.beyond_bound(1.1, None, 1.0).startswith("slower")


def test_published_source_must_say_published(tmp_path: Path) -> None:
    data = json.loads(PUBLISHED.read_text())
    data["source"] = "captured by this project"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StudyError, match="p.json: field 'source'"):
        speed.load_published(path)
    data["source"], data["rows"] = "published", [{"users": 1}]
    path.write_text(json.dumps(data))
    with pytest.raises(StudyError, match="'rows'"):
        speed.load_published(path)


# --------------------------------------------------------------------------- table and verdicts


def apart() -> pd.DataFrame:
    return seeds_frame(
        [
            (1, "auto", 0, 100.0, 10.0, 1000),
            (1, "auto", 1, 101.0, 9.9, 1000),
            (1, "auto", 2, 102.0, 9.8, 1000),
            (1, "fp8", 0, 95.0, 10.5, 1010),
            (1, "fp8", 1, 96.0, 10.4, 1000),
        ]
    )


def test_summary_table_medians_ranges_and_seed_counts() -> None:
    s = speed.summary_table(apart(), ["auto", "fp8"]).set_index("configuration")
    assert s.loc["auto", "median_tpot_ms"] == 101.0
    assert (s.loc["auto", "tpot_min_ms"], s.loc["auto", "tpot_max_ms"]) == (100.0, 102.0)
    assert s.loc["fp8", "median_tpot_ms"] == 95.5 and s.loc["fp8", "seeds"] == 2
    assert s.loc["auto", "output_throughput_tok_s"] == 9.9 and s.loc["fp8", "median_clock_mhz"] == 1005


# --------------------------------------------------------------------------- OLS


def test_ols_recovers_effect_at_equal_clock() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        for arm in ("auto", "fp8"):
            clock = 900 + 25 * i + (60 if arm == "fp8" else 0)
            tpot = 150 - 0.05 * clock - (3.0 if arm == "fp8" else 0.0) + rng.normal(0, 0.2)
            rows.append((1, arm, i, tpot, 10.0, clock))
    est = speed.clock_adjusted(seeds_frame(rows), ["auto", "fp8"]).iloc[0]
    assert "clock_100mhz" in est["model"] and est["cells"] == 24
    low, high = map(float, est["95 % interval (ms)"].split(" to "))
    assert low < -3.0 < high
    assert est["TPOT change (ms)"] == pytest.approx(-3.0, abs=0.3)
    # without the clock term the clock difference (60 MHz = 3 ms) would double the effect
    d = seeds_frame(rows)
    naive = d[d.configuration == "fp8"].median_tpot_ms.mean() - d[d.configuration == "auto"].median_tpot_ms.mean()
    assert naive == pytest.approx(-6.0, abs=0.3)


def test_ols_with_constant_clock_is_plain_difference_and_says_so() -> None:
    d = apart()
    d["median_clock_mhz"] = 2445.0
    est = speed.clock_adjusted(d, ["auto", "fp8"]).iloc[0]
    assert est["model"] == "median_tpot_ms ~ candidate"
    assert est["TPOT change (ms)"] == pytest.approx(95.5 - 101.0)
    assert "clock not varied / not measured (the same 2445 MHz" in est["note"]
    low, high = map(float, est["95 % interval (ms)"].split(" to "))
    assert "at equal clock" not in est["note"] and low < est["TPOT change (ms)"] < high


def test_ols_with_too_few_cells_gives_no_number() -> None:
    d = seeds_frame([(1, "auto", 0, 100.0, 10.0, 1000), (1, "fp8", 0, 95.0, 10.0, 1000)])
    est = speed.clock_adjusted(d, ["auto", "fp8"]).iloc[0]
    assert est["TPOT change (ms)"] is None and "no residual degrees of freedom" in est["note"]


# --------------------------------------------------------------------------- a capture on disk


def make_capture(root: Path) -> sweep.SweepSpec:
    """A small synthetic capture written with the sweep's own writers."""
    spec = sweep.SweepSpec.from_dict(
        {
            "model": "m",
            "configurations": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            "seeds": [0, 1],
            "users": [1, 2],
            "input_len": 8,
            "output_len": 5,
            "cpu_kvcache_space_gib": 1.0,
        }
    )
    write_record(
        root / "manifest.json",
        {"kind": sweep.KIND, "source": "test", "spec": spec.to_dict(), "machine": {"cpu": "x", "gpus": []}},
    )
    for cell in spec.cells():
        if cell.id == "fp8__s1__u2":
            write_record(
                root / "cells" / f"{cell.id}.json",
                {
                    "cell_id": cell.id,
                    "configuration": "fp8",
                    "kv_cache_dtype": "fp8",
                    "seed": 1,
                    "users": 2,
                    "status": "failed",
                    "reason": "server died",
                    "metrics": None,
                },
            )
            continue
        base = 10.0 if cell.arm == "auto" else 9.0
        t0 = 100.0 * (cell.seed + 1) + cell.users
        recs = [
            RequestRecord(
                i, t0 + i, 50.0, 50.0 + 4 * (base + cell.seed), base + cell.seed, [base + cell.seed] * 4, 8, 5
            )
            for i in range(cell.users * 2)
        ]
        write_jsonl_atomic(root / "requests" / f"{cell.id}.jsonl", recs)
        write_jsonl_atomic(
            root / "telemetry" / f"{cell.id}.jsonl",
            [ClockSample(t0 - 1 + k * 0.5, 0.0, "cpu", 2000.0 + k, util_pct=50.0) for k in range(6)],
        )
        write_record(
            root / "cells" / f"{cell.id}.json",
            {
                "cell_id": cell.id,
                "configuration": cell.arm,
                "kv_cache_dtype": spec.arm(cell.arm).kv_cache_dtype,
                "seed": cell.seed,
                "users": cell.users,
                "status": "ok",
                "reason": "",
                "median_clock_mhz": 2002.0,
                "bench_window_s": [t0, t0 + 3],
                "metrics": {
                    "median_tpot_ms": base + cell.seed,
                    "median_ttft_ms": 50.0,
                    "median_itl_ms": base + cell.seed,
                    "output_throughput_tok_s": 100.0 / (base + cell.seed),
                    "completed": cell.users * 2,
                },
            },
        )
    for run in spec.runs():
        write_record(root / "runs" / f"{run.id}.json", {"status": "ok", "record": {"x": run.arm}})
    return spec


def test_load_capture_tables(tmp_path: Path) -> None:
    make_capture(tmp_path)
    cap = speed.load_capture(tmp_path)
    assert list(cap.cells.loc[cap.cells["status"] != "ok", "cell_id"]) == ["fp8__s1__u2"]
    seeds = speed.seed_table(cap)
    assert len(seeds) == 7 and list(seeds["configuration"][:2]) == ["auto", "auto"]
    summary = speed.summary_table(seeds, ["auto", "fp8"]).set_index(["users", "configuration"])
    assert summary.loc[(2, "fp8"), "seeds"] == 1 and summary.loc[(1, "fp8"), "tpot_max_ms"] == 10.0
    assert len(cap.requests) == 4 * 2 + 3 * 4  # 4 ok cells at 1 user (2 requests), 3 at 2 users (4)
    assert cap.requests.groupby("cell_id")["t_rel_s"].min().eq(0).all()
    assert cap.telemetry["t_rel_s"].min() == -1.0
    status = speed.cell_status_frame(cap).set_index("cell")
    assert status.loc["fp8__s1__u2", "status"] == "failed" and status.loc["auto__s0__u1", "status"] == "ok"


def test_figures_draw_from_capture(tmp_path: Path) -> None:
    make_capture(tmp_path)
    cap = speed.load_capture(tmp_path)
    order = ["auto", "fp8"]
    fig = speed.plot_seed_ranges(speed.seed_table(cap), order)
    assert len(fig.axes) == 2
    fig = speed.plot_distributions(cap.requests, order)
    assert len(fig.axes) == 6 and len(fig.axes[1].lines) == 2
    fig = speed.plot_clock(cap.telemetry, order)
    assert len(fig.axes) == 4  # clock and utilisation rows, one column per user count


def test_open_or_complete_without_running(tmp_path: Path) -> None:
    cap, said = speed.open_or_complete({}, tmp_path / "none", False, "test", print)
    assert cap is None and "only the published table" in said
    make_capture(tmp_path)
    cap, said = speed.open_or_complete({}, tmp_path, False, "test", print)
    assert cap is not None and "as it is" in said


def test_load_capture_rejects_non_capture(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="manifest.json: missing"):
        speed.load_capture(tmp_path)


def test_capture_verdicts_use_per_run_requests(tmp_path: Path) -> None:
    make_capture(tmp_path)
    cap = speed.load_capture(tmp_path)
    verdicts = vt.capture_verdicts(cap)
    assert [(v.users, v.candidate) for v in verdicts] == [(1, "fp8"), (2, "fp8")]
    one = verdicts[0].verdict
    assert one.runs == {"baseline": 2, "candidate": 2}
    assert one.tpot_ratio == pytest.approx(((9.0 * 10.0) / (10.0 * 11.0)) ** 0.5)  # geometric means of run medians
    assert one.verdict == "no claim" and one.min_p_value == pytest.approx(0.5)  # 2 seed blocks: 2 / 2^2
    assert one.blocks == 2 and one.order_design not in (
        "grouped",
        "unknown",
    )  # interleaved: seed 0 of both arms before seed 1 of both
    assert verdicts[0].bound_pct is None and "not computed" in verdicts[0].bound_note  # model "m" has no config
    frame = render(verdicts, SPEED_VERDICTS)
    assert frame.loc[0, "roofline bound (% less time)"] == "not computed"
    assert frame.loc[0, "change"].startswith("faster by")
    assert list(render(verdicts, SPEED_VERDICT_DESIGN).columns[:2]) == ["users", "baseline → candidate"]
    assert "why" not in render(verdicts, SPEED_VERDICT_DESIGN).columns
    # the capture's own copy of the model's config.json serves where the model folder is absent
    kept = tmp_path / "model" / "config.json"
    kept.parent.mkdir()
    kept.write_text((PUBLISHED.parents[1] / "captures" / "speed-cpu" / "model" / "config.json").read_text())
    bounded = vt.capture_verdicts(speed.load_capture(tmp_path))[0]
    assert bounded.bound_pct is not None and bounded.bound_pct > 0 and str(kept) in bounded.bound_note
    assert "p, Holm over 2 tests" in render(verdicts, SPEED_VERDICT_MAIN).columns
    text = vt.finding_text([], verdicts, "vllm-cpu")
    assert "vllm-cpu, 1 user(s): fp8 vs auto: no claim (faster by" in text


# --------------------------------------------------------------------------- crossed arms, pool, finding


def _confs(*items: dict) -> list:
    from kvstudy.bench.spec import Arm

    return [Arm(**i) for i in items]


def test_crossed_design_separates_dtype_from_backend_and_states_the_aa() -> None:
    confs = _confs(
        {"name": "bf16"},
        {"name": "bf16-triton", "attention_backend": "TRITON_ATTN"},
        {"name": "fp8-triton", "kv_cache_dtype": "fp8", "attention_backend": "TRITON_ATTN"},
        {"name": "bf16-repeat"},
    )
    pairs = vt.comparison_pairs(confs)
    assert ("bf16", "bf16-triton", "attention backend") in pairs
    assert ("bf16", "fp8-triton", "KV dtype + attention backend together") in pairs
    assert ("bf16-triton", "fp8-triton", "KV dtype alone (both on TRITON_ATTN)") in pairs
    assert ("bf16", "bf16-repeat", "A/A (noise: identical configurations)") in pairs
    assert len(pairs) == 4


def test_plain_design_compares_each_with_the_baseline() -> None:
    pairs = vt.comparison_pairs(
        _confs({"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}, {"name": "auto-repeat"})
    )
    assert [(b, c) for b, c, _ in pairs] == [("auto", "fp8"), ("auto", "auto-repeat")]
    assert pairs[0][2] == "KV dtype"


def test_finding_gives_the_first_reason_without_repeating_the_verdict() -> None:
    def published(why: str) -> vt.PublishedVerdict:
        return vt.PublishedVerdict(1, (10.0, 9.0), (3, 2), 0.9, 0.2, 1.0, (1.0, 1.0), 1024, None, "", (why,))

    why = "no claim, the design cannot reach significance: 3 vs 2 seeds; per-seed values were not published"
    text = vt.finding_text([published(why), published("clocks differ by +6 %")], [], "L4")
    assert text == (
        "L4 published, 1 user(s): FP8 faster by 10.0 % per token, no claim (the design cannot reach significance); "
        "L4 published, 1 user(s): FP8 faster by 10.0 % per token, no claim (clocks differ by +6 %)"
    )


def test_admission_rows_count_blocks_with_the_allocator(tmp_path: Path) -> None:
    # 2 layers, 2 KV heads of 64: the block count per request depends only on tokens and block size
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "num_hidden_layers": 2,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "torch_dtype": "bfloat16",
                "max_position_embeddings": 4096,
                "vocab_size": 1000,
            }
        )
    )
    rows = vt.admission_rows(tmp_path, 1152, [1, 32], 1506, device="cuda")
    assert rows[1].blocks_per_request == 72 and rows[1].waiting == 32 - 1506 // 72 and rows[0].waiting == 0
    frame = render(rows, ADMISSION)
    row = frame.set_index("users").loc[32]
    assert row["blocks per request"] == 72 and row["blocks needed by all users"] == 32 * 72
    assert row["requests that fit at once"] == 1506 // 72 and row["queueing"].startswith("yes")
    assert frame.set_index("users").loc[1, "queueing"] == "no"


def _edit_cell(root: Path, cell_id: str, **fields: object) -> None:
    path = root / "cells" / f"{cell_id}.json"
    data = json.loads(path.read_text())
    data.update(fields)
    write_record(path, data)


def test_window_shorter_than_the_sampling_interval_is_not_measurable(tmp_path: Path) -> None:
    make_capture(tmp_path)  # spec interval 0.25 s; auto__s0__u1 starts at t0 = 101
    _edit_cell(tmp_path, "auto__s0__u1", bench_window_s=[101.0, 101.1])
    runs = {r.name: r for r in vt.capture_runs(speed.load_capture(tmp_path), "auto", 1)}
    assert not runs["auto__s0__u1"].measurable
    assert any("clock sampling interval" in why for why in runs["auto__s0__u1"].unmeasurable_reasons)
    assert runs["auto__s1__u1"].measurable
    # the same short window bracketed by edge samples holds a clock: the interval no longer limits it
    _edit_cell(
        tmp_path, "auto__s0__u1", clock_window_s=[100.9, 101.2], clock_samples_in_window=2, clock_interval_s=0.25
    )
    runs = {r.name: r for r in vt.capture_runs(speed.load_capture(tmp_path), "auto", 1)}
    assert runs["auto__s0__u1"].measurable


def test_calibration_says_why_a_user_count_has_too_few_aa_runs(tmp_path: Path) -> None:
    make_capture(tmp_path)
    _edit_cell(tmp_path, "auto__s0__u1", bench_window_s=[101.0, 101.1])
    frame = vt.calibration_frame(speed.load_capture(tmp_path)).set_index("users")
    col = "false claims, real splits"
    assert frame.loc[1, "A/A runs"] == "1 measurable of 2"
    assert frame.loc[1, col].startswith("not computed: fewer than 2 measurable A/A runs")
    assert "shorter than the clock sampling interval" in frame.loc[1, col]
    # 2 measurable runs at 2 users: a split that cannot reach p < 0.05 is not reported as calibrated
    assert frame.loc[2, col].startswith("calibration not possible with this design")
