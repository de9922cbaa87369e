"""A synthetic context-sweep capture analysed end to end (no vLLM), and the published-vs-roofline table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvstudy.bench.grid import write_requests
from kvstudy.bench.result import RequestRecord
from kvstudy.context.predict import published_vs_roofline
from kvstudy.context.sweep import KIND, ContextSweepSpec, analyse_capture, plot_fits, points_frame, slope_table
from kvstudy.errors import StudyError
from kvstudy.report.tables import ARM_COMPARISONS, ROOFLINE_VS_PUBLISHED, SLOPES, render

ROOT = Path(__file__).resolve().parents[3]


def _capture(tmp: Path, model: Path, fp8_fails: bool, inline_requests: bool = False) -> Path:
    """A synthetic capture of the tiny model's grid (``model``: a folder with its config.json), its
    per-request rows in ``requests/<cell>.jsonl`` (``inline_requests``: in the cell records, the
    layout before the grid engine)."""
    spec = ContextSweepSpec.from_dict(
        {
            "model": str(model),
            "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            "lengths": [256, 1024, 2048],
            "seeds": [0, 1, 2],
            "output_len": 8,
            "cpu_kvcache_space_gib": 1,
        }
    )
    (tmp / "cells").mkdir(parents=True)
    (tmp / "runs").mkdir()
    (tmp / "manifest.json").write_text(json.dumps({"kind": KIND, "spec": spec.to_dict()}))
    (tmp / "bandwidth.json").write_text(
        json.dumps({"best_gb_s": 10.0, "copy_gb_s": 9.0, "triad_gb_s": 10.0, "threads_note": "one thread"})
    )
    rng = np.random.default_rng(0)
    for arm, seed in ((r.arm, r.seed) for r in spec.runs()):
        failed = arm == "fp8" and fp8_fails
        (tmp / "runs" / f"{arm}__s{seed}.json").write_text(
            json.dumps(
                {
                    "status": "failed" if failed else "ok",
                    "reason": "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
                }
            )
        )
        for L in spec.lengths:
            rec = {"cell_id": f"{arm}__s{seed}__L{L}", "arm": arm, "seed": seed, "input_len": L, "output_len": 8}
            if failed:
                rec.update(status="failed", start_failed=True, reason="server did not start")
            else:
                slope = 1e-3 if arm == "auto" else 5e-4
                base = 2.0 if arm == "auto" else 2.5
                reqs = []
                for _ in range(4):
                    tpot = base + slope * L + rng.normal(0, 0.01)
                    reqs.append(
                        {
                            "ttft_ms": 10.0,
                            "e2el_ms": 10.0 + 7 * tpot,
                            "tpot_ms": tpot,
                            "itls_ms": [tpot] * 7,
                            "input_len": L,
                            "output_len": 8,
                            "success": True,
                            "error": "",
                        }
                    )
                rec.update(status="ok")
                if inline_requests:
                    rec.update(requests=reqs)
                else:
                    records = [RequestRecord(index=i, start_time_s=None, **r) for i, r in enumerate(reqs)]
                    write_requests(tmp, rec["cell_id"], records)
            (tmp / "cells" / f"{rec['cell_id']}.json").write_text(json.dumps(rec))
    return tmp


def test_both_arms_measured(tmp_path: Path, qwen3_config_model: Path) -> None:
    a = analyse_capture(_capture(tmp_path, qwen3_config_model, fp8_fails=False), n_boot=300)
    assert set(a.fits) == {"auto", "fp8"} and not a.not_measured
    cmp = a.comparisons[0]
    assert cmp.slope_ratio == pytest.approx(0.5, abs=0.05)
    assert cmp.break_even_tokens == pytest.approx(1000, rel=0.2)
    pred = {r.arm: r.predicted_ms for r in slope_table(a)}
    # tiny model: 4 layers x 2 KV heads x 64 x (K+V) x 2 bytes = 2,048 B/token at 10 GB/s
    assert pred["auto"] == pytest.approx(2048 / 10e9 * 1e3)
    assert pred["fp8"] == pytest.approx(pred["auto"] / 2)
    assert len(points_frame(a)) == 18 and len(render(a.comparisons, ARM_COMPARISONS)) == 1
    plot_fits(a, pred)


def test_fp8_failed_start_is_not_measured(tmp_path: Path, qwen3_config_model: Path) -> None:
    a = analyse_capture(_capture(tmp_path, qwen3_config_model, fp8_fails=True), n_boot=300)
    assert set(a.fits) == {"auto"} and a.comparisons == ()
    assert "AVX-512" in a.not_measured["fp8"]
    row = {r.arm: r for r in slope_table(a)}["fp8"]
    assert row.slope_ms is None and "AVX-512" in row.not_measured
    assert row.status.startswith("not measured on this machine")
    shown = render(slope_table(a), SLOPES).set_index("arm")
    assert shown.loc["fp8", "95 % interval"] == "" and shown.loc["auto", "measured / predicted, 95 %"] != ""


def test_inline_rows_are_refused_in_one_line(tmp_path: Path, qwen3_config_model: Path) -> None:
    old = _capture(tmp_path, qwen3_config_model, fp8_fails=False, inline_requests=True)
    with pytest.raises(
        StudyError, match=r"auto__s0__L\d+.json: per-request rows inline, an older capture format; expected them in"
    ) as err:
        analyse_capture(old)
    assert "\n" not in str(err.value)


def test_an_ok_cell_without_its_rows_is_one_line(tmp_path: Path, qwen3_config_model: Path) -> None:
    cap = _capture(tmp_path, qwen3_config_model, fp8_fails=False)
    (cap / "requests" / "fp8__s1__L1024.jsonl").unlink()
    with pytest.raises(StudyError, match=r"requests/fp8__s1__L1024.jsonl: missing"):
        analyse_capture(cap)


def test_missing_capture_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="manifest.json: missing") as err:
        analyse_capture(tmp_path)
    assert "\n" not in str(err.value)


def test_published_vs_roofline_rows() -> None:
    rows = published_vs_roofline(ROOT / "data" / "models")
    t = render(rows, ROOFLINE_VS_PUBLISHED)
    key = t.set_index(["figure", "quantity"])
    assert key.loc[("llama-3.1-8b-h100", "slope ratio FP8/BF16"), "published"] == pytest.approx(2.37 / 4.37)
    assert key.loc[("llama-3.1-8b-h100", "slope ratio FP8/BF16"), "roofline"] == pytest.approx(0.5)
    assert key.loc[("llama-3.1-8b-h100", "implied fixed FP8 cost per step (ms)"), "published"] == pytest.approx(0.14)
    assert key.loc[("gpt-oss-20b-skip-sw", "slope ratio FP8/BF16"), "roofline"] == pytest.approx(0.5)
    # 131,072 B/token at the H100 SXM's 3,350 GB/s peak
    assert key.loc[("llama-3.1-8b-h100", "BF16 ITL slope (ms/token)"), "roofline"] == pytest.approx(
        131072 / 3350e9 * 1e3
    )
    assert (t["published origin"] != "").all()


def test_the_roofline_is_compared_only_where_the_kv_outgrows_the_cache() -> None:
    from kvstudy.context.predict import CACHE_MARGIN, roofline_applies

    mib = 2**20
    assert roofline_applies(200 * mib, 32 * mib, "recorded", 8192) == (True, "")
    applies, why = roofline_applies(6 * mib, 32 * mib, "recorded at capture time", 3136)
    assert not applies and "not well beyond the 32 MiB last-level cache" in why
    assert not roofline_applies(CACHE_MARGIN * 32 * mib - 1, 32 * mib, "x", 1)[0]
    applies, why = roofline_applies(6 * mib, None, "", 3136)
    assert not applies and "does not say how large" in why


def test_bundled_context_capture_makes_no_roofline_claim() -> None:
    from kvstudy.context.sweep import analyse_capture

    row = {r.arm: r for r in slope_table(analyse_capture(ROOT / "data" / "captures" / "context-cpu", n_boot=100))}[
        "auto"
    ]
    assert row.resolved and not row.roofline_applies and "last-level cache" in row.no_claim
    assert "no claim against the roofline" in row.status and 18 < (row.kv_longest_mib or 0) < 19


def test_last_level_cache_from_sysfs(tmp_path: Path) -> None:
    from kvstudy.machine import last_level_cache_bytes

    for index, (level, size) in enumerate([(1, "32K"), (2, "1024K"), (3, "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(str(tmp_path)) == 32 * 2**20
    assert last_level_cache_bytes(str(tmp_path / "none")) is None
