"""`kvstudy plan` splits the load experiment into pair-blocks: every arm of one seed, in ABBA order."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvstudy.distribute.plan import make_plan, read_plan
from kvstudy.load.spec import LoadSpec

ROOT = Path(__file__).resolve().parents[3]
MODEL = str(ROOT / "data" / "captures" / "speed-cpu" / "model")
SECTION = {
    "capture": "captures/x/load",
    "run_missing": True,
    "model": MODEL,
    "arms": [
        {"name": "auto", "kv_cache_dtype": "auto"},
        {"name": "fp8", "kv_cache_dtype": "fp8"},
        {"name": "auto-repeat", "kv_cache_dtype": "auto"},
    ],
    "seeds": [0, 1, 2],
    "kv_memory_bytes": 13 * 786_432,
    "load_factors": [0.5, 1.0, 2.0, 3.0],
    "input_len": 192,
    "output_len": 128,
    "max_num_seqs": 16,
    "ttft_ms": 1000,
}


def test_plan_splits_the_load_experiment_into_pair_blocks(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "loadonly.yaml").write_text(
        yaml.safe_dump({"description": "load only", "defaults": {}, "notebooks": {"08_load-at-equal-memory": SECTION}})
    )
    plan_id, records, written = make_plan("loadonly", tmp_path / "plan", root=ROOT, profiles_dir=profiles)
    assert written and [r["experiment"] for r in records] == ["load"] * 3
    assert [r["seed"] for r in records] == [0, 1, 2]
    # each block holds every arm of one seed, in the order the one-machine run gives them (ABBA)
    assert [r["server_starts"] for r in records] == [
        ["auto__s0", "fp8__s0", "auto-repeat__s0"],
        ["auto-repeat__s1", "fp8__s1", "auto__s1"],
        ["auto__s2", "fp8__s2", "auto-repeat__s2"],
    ]
    assert all(r["same_order_as_one_machine"] for r in records)
    assert records[0]["aa_controls"] == ["auto-repeat"] and records[0]["baseline"] == "auto"
    assert records[0]["kv_memory"]["kv_memory_bytes"] == 13 * 786_432 and records[0]["device"] == "cpu"
    assert records[0]["gpus_per_block"] == 0
    # a block's spec is the experiment's at one seed: the same ladder, the same equal-memory pools
    block = LoadSpec.from_dict(records[1]["spec"])
    assert block.seeds == [1] and block.loads() == [2, 4, 8, 12]
    assert read_plan(tmp_path / "plan")[0] == plan_id
