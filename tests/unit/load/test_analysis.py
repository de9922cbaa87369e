"""The load analysis on a synthetic capture (cells written as the runner writes them, no vLLM): knees,
users table against the predicted capacity, comparisons with Holm over the report, the card's facts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from kvstudy.bench.grid import write_record, write_requests
from kvstudy.load import analysis as load
from kvstudy.load.runner import prepare_capture
from kvstudy.load.spec import LoadCellResult, LoadSpec

MODEL = str(Path(__file__).resolve().parents[3] / "data" / "captures" / "speed-cpu" / "model")
KNEE = {"auto": 4, "fp8": 8, "auto-repeat": 4}  # the synthetic arms' knees (the predicted capacities: 4, 8, 4)


def synthetic(tmp_path: Path, seeds: int, fp8_fails: bool = False) -> Path:
    spec = LoadSpec.from_dict(
        {
            "model": MODEL,
            "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}, {"name": "auto-repeat"}],
            "seeds": list(range(seeds)),
            "kv_memory_bytes": 13 * 786_432,
            "load_factors": [0.5, 1.0, 2.0, 3.0],
            "input_len": 192,
            "output_len": 128,
            "max_num_seqs": 16,
            "ttft_ms": 1500,
        }
    )
    prepare_capture(spec, tmp_path, "synthetic test capture")
    for cell in spec.cells():
        met = cell.users <= KNEE[cell.arm]
        share = (0.95 + 0.01 * (cell.seed % 3)) if met else 0.4 - 0.01 * cell.seed
        status = "failed" if fp8_fails and cell.arm == "fp8" else "ok"
        res = LoadCellResult(
            cell_id=cell.id,
            arm=cell.arm,
            kv_cache_dtype=spec.arm(cell.arm).kv_cache_dtype,
            seed=cell.seed,
            concurrency=cell.users,
            status=status,
            reason="server did not start: FP8 KV cache on CPU requires AVX-512" if status != "ok" else "",
            share_within_target=share if status == "ok" else None,
            requests=20,
            within_target=int(share * 20),
        )
        write_record(tmp_path / "cells" / f"{cell.id}.json", asdict(res))
        if status == "ok":
            write_requests(tmp_path, cell.id, [])  # the knees come from the shares; no request rows needed
    return tmp_path


def test_knees_users_and_capacity(tmp_path: Path) -> None:
    cap = load.load_capture(synthetic(tmp_path, 3))
    users = load.users_table(cap).set_index("arm")
    assert users.loc["auto", "users within target (median)"] == 4
    assert users.loc["fp8", "users within target (median)"] == 8
    assert users.loc["fp8", "predicted capacity (requests)"] == 8
    assert users.loc["auto", "knee vs capacity"] == "within one load step"


def test_three_blocks_measure_but_claim_nothing(tmp_path: Path) -> None:
    cap = load.load_capture(synthetic(tmp_path, 3))
    comps, per_load = load.comparisons(cap)
    fp8, aa = comps
    assert fp8.ratio == pytest.approx(2.0) and aa.ratio == pytest.approx(1.0)
    assert fp8.claim == aa.claim == "no claim"
    assert len(per_load) == 2 * 4 and per_load["p, Holm"].notna().all()
    facts = load.verdict_facts(cap, comps)
    assert facts["state"] == "no claim" and facts["users_fp8"] == 8 and facts["users_baseline"] == 4
    assert facts["users_ratio"] == pytest.approx(2.0) and facts["claim"] == "no claim"
    assert facts["context_tokens"] == 320 and facts["latency_target"].startswith("TTFT ≤ 1500 ms")


def test_ten_blocks_claim_more_users_and_the_aa_arm_none(tmp_path: Path) -> None:
    cap = load.load_capture(synthetic(tmp_path, 10))
    comps, _ = load.comparisons(cap)
    fp8, aa = comps
    assert fp8.claim == "more users", fp8.reasons
    assert fp8.p_holm is not None and fp8.p_holm < 0.05  # Holm over 2 users tests + 8 per-load tests
    assert aa.claim == "no claim"
    assert load.verdict_facts(cap, comps)["state"] == "measured"


def test_a_failed_arm_is_reported_not_compared(tmp_path: Path) -> None:
    cap = load.load_capture(synthetic(tmp_path, 3, fp8_fails=True))
    comps, _ = load.comparisons(cap)
    assert comps[0].ratio is None and comps[0].claim == "no claim"
    cells = load.cell_table(cap)
    assert (cells[cells["arm"] == "fp8"]["status"] == "failed").all()
    fig = load.plot_load(cap, cells)  # failed cells marked with their cause under the axes
    assert any("AVX-512" in t.get_text() for t in fig.texts)
