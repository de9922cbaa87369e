"""The load experiment's spec: equal KV bytes per arm, the ladder and the checks made before anything starts."""

from __future__ import annotations

import pytest

from kvstudy.bench.spec import Cell
from kvstudy.errors import StudyError
from kvstudy.load.spec import LoadSpec, arm_pools, check_design, check_knobs, ladder

# The speed model (6 layers, 4 KV heads of 64): 2 x 6 x 4 x 64 x 2 bytes x 128 tokens per 16-bit block.
MODEL = "data/captures/speed-cpu/model"
BF16_BLOCK = 2 * 6 * 4 * 64 * 2 * 128  # 786,432
FP8_BLOCK = BF16_BLOCK // 2


def spec(**over):
    data = {
        "model": MODEL,
        "arms": [
            {"name": "auto", "kv_cache_dtype": "auto"},
            {"name": "fp8", "kv_cache_dtype": "fp8"},
            {"name": "auto-repeat", "kv_cache_dtype": "auto"},
        ],
        "seeds": [0, 1],
        "kv_memory_bytes": 13 * BF16_BLOCK,
        "input_len": 256,
        "output_len": 128,
        "ttft_ms": 2000,
        "tpot_ms": 100,
    }
    data.update(over)
    return LoadSpec.from_dict(data)


def test_equal_bytes_give_fp8_twice_the_blocks_hand_values() -> None:
    pools = arm_pools(spec())
    assert BF16_BLOCK == 786_432
    assert pools["auto"].bytes_per_block == BF16_BLOCK and pools["fp8"].bytes_per_block == FP8_BLOCK
    assert (pools["auto"].num_blocks, pools["fp8"].num_blocks) == (13, 26)
    assert (pools["auto"].tokens, pools["fp8"].tokens) == (1664, 3328)
    # 384 tokens a request = 3 blocks of 128, in 12 and 25 blocks (one is vLLM's null block): 4 and 8 requests
    assert (pools["auto"].blocks_per_request, pools["auto"].requests, pools["fp8"].requests) == (3, 4, 8)
    assert pools["auto-repeat"] == pools["auto"].__class__(**{**pools["auto"].__dict__, "arm": "auto-repeat"})


def test_bytes_between_blocks_round_down() -> None:
    pools = arm_pools(spec(kv_memory_bytes=13 * BF16_BLOCK + FP8_BLOCK - 1))
    assert (pools["auto"].num_blocks, pools["fp8"].num_blocks) == (13, 26)
    # the null block: 12 blocks hold 3 requests of 3 blocks, not 4
    assert arm_pools(spec(kv_memory_bytes=12 * BF16_BLOCK))["auto"].requests == 3


def test_ladder_hand_values() -> None:
    assert ladder([0.5, 1, 1.5, 2, 3], 4) == [2, 4, 6, 8, 12]
    assert ladder([0.1, 0.2, 1.0], 4) == [1, 4]  # at least 1, repeats merged
    assert ladder([0.5, 1.25], 3) == [2, 4]  # 1.5 rounds half up
    assert spec().loads() == [2, 4, 6, 8, 12]


def test_requests_per_cell_rule_and_cells() -> None:
    s = spec(rounds_per_cell=3)
    assert s.bench_settings(Cell("auto", 0, 6, "c")).num_prompts == 18
    cells = s.cells()
    assert len(cells) == 3 * 2 * 5
    assert [c.id for c in cells[:2]] == ["auto__s0__c2", "auto__s0__c4"]
    # ABBA: seed 1 runs the arms reversed
    assert [r.id for r in s.runs()] == [
        "auto__s0",
        "fp8__s0",
        "auto-repeat__s0",
        "auto-repeat__s1",
        "fp8__s1",
        "auto__s1",
    ]
    b = s.bench_settings(cells[-1])
    assert (b.max_concurrency, b.num_prompts, b.goodput) == (12, 36, ("ttft:2000", "tpot:100"))


def test_server_config_carries_the_equal_bytes_per_device() -> None:
    s = spec()
    cpu_auto = s.server_config(s.runs()[0])
    cpu_fp8 = s.server_config(s.runs()[1])
    # the same bytes for both arms; vLLM makes them 13 and 26 blocks (the pool check reads that back)
    assert cpu_auto.kv_cache_memory_bytes == cpu_fp8.kv_cache_memory_bytes == 13 * BF16_BLOCK
    assert cpu_auto.cpu_kvcache_space_gib is None and cpu_auto.num_gpu_blocks_override is None
    assert cpu_fp8.kv_cache_dtype == "fp8" and cpu_auto.max_model_len == 384
    assert cpu_auto.extra_args[-2:] == ["--max-num-seqs", "64"]
    gpu = spec(device="cuda").server_config(s.runs()[1])
    assert gpu.kv_cache_memory_bytes == 13 * BF16_BLOCK and gpu.num_gpu_blocks_override is None
    assert gpu.cpu_kvcache_space_gib is None


def test_design_checks_pass_for_a_good_grid() -> None:
    assert check_design(spec())["fp8"].requests == 8


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"load_factors": [0.5, 1.0]}, "load_factors: the highest load (4 users) never passes the 4 requests"),
        ({"kv_memory_bytes": 3 * BF16_BLOCK}, "kv_memory_bytes: 2,359,296 bytes give arm 'auto' 3 block"),
        ({"max_num_seqs": 8}, "passes max_num_seqs 8"),
        ({"server_env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}, "server_env: sets VLLM_CPU_KVCACHE_SPACE"),
    ],
)
def test_design_refusals_name_the_field(over, words) -> None:
    with pytest.raises(StudyError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_design(spec(**over))


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"kv_memory_bytes": None}, "kv_memory_bytes: expected a valid integer, got None"),
        ({"ttft_ms": None, "tpot_ms": None}, "no latency target"),
        ({"target_share": 1.5}, "target_share"),
        ({"load_factors": [0, 1]}, "load_factors\\[0\\]: expected greater than 0"),
        ({"load_factors": "1,2"}, "load_factors: expected a valid list"),
        ({"device": "tpu"}, "device: expected 'cpu' or 'cuda'"),
        ({"arms": [{"name": "auto"}]}, "arms: expected at least 2 items"),
        ({"server_extra_args": ["--max-num-seqs", "8"]}, "sets --max-num-seqs"),
        ({"max_model_len": 100}, "shorter than input_len"),
        ({"surprise": 1}, "unknown field"),
    ],
)
def test_bad_specs_one_line(over, words) -> None:
    with pytest.raises(StudyError, match=words):
        spec(**over)


def test_a_knob_the_engine_lacks_is_refused(monkeypatch) -> None:
    from kvstudy.vllm import command

    table = command.OptionTable((("--max-num-seqs",), ("--max-model-len",), ("--kv-cache-dtype",)), True, "an old vLLM")
    monkeypatch.setattr(command, "option_table", lambda: table)
    with pytest.raises(StudyError, match="--kv-cache-memory-bytes not among the options of an old vLLM"):
        check_knobs(spec())
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    with pytest.raises(StudyError, match="environment: VLLM_CPU_KVCACHE_SPACE=1 would replace"):
        check_knobs(spec())


def test_the_snapshot_table_has_the_knobs(monkeypatch) -> None:
    monkeypatch.setenv("KVSTUDY_NO_VLLM", "1")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    check_knobs(spec())
