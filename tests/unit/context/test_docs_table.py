"""vLLM's documented L4 table (Qwen3-4B) is bundled with its source and set beside the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.context.predict import docs_table_vs_roofline

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "data" / "published" / "vllm-docs-l4-qwen3-4b.json"


def test_docs_table_is_labelled_with_its_source() -> None:
    data = json.loads(TABLE.read_text())
    assert data["source"] == "published" and "vLLM documentation" in data["source_text"]
    assert [r["fp8_throughput_change_pct"] for r in data["rows"]] == [1, 6, 11, 21]
    assert "vllm-docs-l4-qwen3-4b.json" in (ROOT / "data" / "published" / "SOURCE.md").read_text()


def test_qwen3_4b_config_has_the_published_sizes() -> None:
    cfg = json.loads((ROOT / "data" / "models" / "Qwen3-4B" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["hidden_size"]) == (
        36,
        8,
        128,
        2560,
    )
    assert (cfg["intermediate_size"], cfg["num_attention_heads"], cfg["vocab_size"]) == (9728, 32, 151936)
    assert cfg["tie_word_embeddings"] is True and cfg["max_position_embeddings"] == 40960
    assert "`Qwen3-4B`" in (ROOT / "data" / "models" / "SOURCE.md").read_text()


def test_docs_table_beside_the_roofline() -> None:
    rows = docs_table_vs_roofline(TABLE, ROOT / "data" / "models")
    assert [r.tokens for r in rows] == [2048, 8192, 16384, 32768]
    predicted = [r.roofline_pct for r in rows]
    assert predicted == sorted(predicted)
    assert predicted[-1] == pytest.approx(23.08, abs=0.05)
