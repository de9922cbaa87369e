"""A start whose logged pool disagrees with the prediction for its dtype is a failed start with both numbers."""

from __future__ import annotations

from kvstudy.load.runner import pool_check
from kvstudy.load.spec import LoadSpec

MODEL = "data/captures/speed-cpu/model"
BF16_BLOCK = 786_432


def spec() -> LoadSpec:
    return LoadSpec.from_dict(
        {
            "model": MODEL,
            "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
            "seeds": [0],
            "kv_memory_bytes": 13 * BF16_BLOCK,
            "ttft_ms": 1000,
        }
    )


LINE = "(EngineCore pid=1) INFO 12-01 09:11:15 [kv_cache_utils.py:2327] CPU KV cache size: {} tokens, Maximum concurrency for 384 tokens per request: 4.00x\n"


def test_the_logged_pool_matches_the_prediction_per_dtype() -> None:
    assert pool_check(spec(), "auto", LINE.format("1,664"))["ok"]
    assert pool_check(spec(), "fp8", LINE.format("3,328"))["ok"]


def test_a_disagreeing_pool_fails_with_both_numbers() -> None:
    out = pool_check(spec(), "fp8", LINE.format("1,664"))  # FP8 given only the 16-bit pool
    assert not out["ok"]
    assert "logged pool (1,664 tokens) disagrees" in out["reason"] and "(3,328 tokens)" in out["reason"]
    assert (out["logged_tokens"], out["predicted_tokens"]) == (1664, 3328)


def test_a_log_without_a_pool_line_fails() -> None:
    out = pool_check(spec(), "auto", "nothing here\n")
    assert not out["ok"] and "no 'KV cache size' line" in out["reason"]
