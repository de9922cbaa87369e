"""The startup-log parser on what issue 20 found it missing: current backend lines (CUDA's enum, ROCm's
prose), logs with several start attempts, a wrapper's "Starting vLLM server..." echo, the memory lines
around the pool, the V0 engine's block line, and real GPU log excerpts from public issues."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.vllm.startup_log import parse_startup_log, parse_startup_text, split_attempts

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "startup-logs"
P = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [x.py:1] "


@pytest.mark.parametrize(
    "line, backend, forced",
    [
        ("Using AttentionBackendEnum.TRITON_ATTN backend.", "TRITON_ATTN", True),
        ("Using TRITON_ATTN backend.", "TRITON_ATTN", True),
        ("Using Triton Attention backend.", "TRITON_ATTN", False),  # ROCm
        ("Using Rocm Attention backend.", "ROCM_ATTN", False),
        ("Using ROCM_AITER_FA backend (selected via --attention-backend).", "ROCM_AITER_FA", True),
        ("Using TRITON_ATTN backend out of potential backends: ['TRITON_ATTN', 'ROCM_ATTN'].", "TRITON_ATTN", False),
        (
            "Using AttentionBackendEnum.FLASH_ATTN attention backend out of potential backends: "
            "['AttentionBackendEnum.FLASH_ATTN', 'AttentionBackendEnum.FLASHINFER'].",
            "FLASH_ATTN",
            False,
        ),
    ],
)
def test_current_backend_lines(line: str, backend: str, forced: bool) -> None:
    info = parse_startup_text(P + line + "\n")
    assert info.attention_backend == backend
    assert info.attention_backend_forced is forced


@pytest.mark.parametrize(
    "line", ["Using cpu backend.", "Using Torch SDPA backend for ViT model.", "Using backend X for vit attention"]
)
def test_lines_that_name_no_attention_backend(line: str) -> None:
    assert parse_startup_text(P + line + "\n").attention_backend is None


def _attempt(pool: str, tail: str) -> str:
    return (
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.32.0\n"
        "(EngineCore pid=2) INFO 01-01 00:00:01 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='/m/Qwen3-8B', dtype=torch.bfloat16, max_seq_len=4096, kv_cache_dtype=auto, device_config=cuda\n"
        + pool
        + tail
    )


def test_two_attempts_are_read_from_the_last() -> None:
    first = _attempt(
        "", "(EngineCore pid=2) ERROR 01-01 00:00:02 [core.py:1] EngineCore failed to start.\nValueError: boom\n"
    )
    second = _attempt(
        "(EngineCore pid=3) INFO 01-01 00:01:00 [kv_cache_utils.py:1] GPU KV cache size: 1,000 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 0.24x\n",
        "INFO:     Application startup complete.\n",
    )
    assert len(split_attempts(first + second)) == 2
    info = parse_startup_text(first + second)
    assert info.attempts == 2 and info.failed is False and info.ready is True and info.pool_tokens == 1000
    reverse = parse_startup_text(second + first)  # the failed attempt last: that is the diagnosis
    assert reverse.failed is True and reverse.pool_tokens is None and "boom" in str(reverse.failure_cause)


def test_one_attempt_with_several_engines_is_not_split() -> None:
    text = (
        "(EngineCore_DP0 pid=2) INFO 01-01 00:00:01 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: x\n"
        "(EngineCore_DP1 pid=3) INFO 01-01 00:00:01 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: x\n"
    )
    assert len(split_attempts(text)) == 1


def test_a_wrapper_echo_is_not_readiness() -> None:
    info = parse_startup_text("Starting vLLM server...\n" + _attempt("", ""))
    assert info.ready is False
    real = parse_startup_text(_attempt("", "INFO:     Application startup complete.\n"))
    assert real.ready is True


def test_engine_config_line_names_model_dtype_and_block() -> None:
    info = parse_startup_text(_attempt("", "").replace("device_config=cuda", "device_config=cuda, block_size=32"))
    assert (info.model, info.model_dtype, info.block_size, info.max_model_len) == ("/m/Qwen3-8B", "bfloat16", 32, 4096)


def test_public_gpu_log_with_vllm_memory_summary() -> None:
    info = parse_startup_log(FIXTURES / "club3090-1087-memory-line.log")
    assert info.memory == {
        "cuda_graphs": 0.09,
        "requested": 28.88,
        "weights_and_non_torch": 15.03,
        "activation_peak": 1.59,
    }


def test_public_v0_log_blocks_and_memory() -> None:
    info = parse_startup_log(FIXTURES / "vllm-10517-llama-3.1-8b-rtx3090-v0.log")
    assert info.pool_blocks == 1952 and info.device == "gpu"
    assert info.available_kv_memory_gib == pytest.approx(3.81)
    assert info.max_concurrency_len == 20000 and info.max_concurrency == pytest.approx(1.56)
    assert info.memory["weights"] == pytest.approx(14.9888) and info.memory["non_torch"] == pytest.approx(0.35)
    assert info.memory["requested"] == pytest.approx(21.22)


@pytest.mark.parametrize(
    "name, memory, tokens, max_len",
    [
        ("lmcache-1739-qwen3-14b-gpu.log", 6.51, 42_656, 32_768),
        ("vllm-25350-fp8-gpu.log", 10.55, 230_528, 100_000),
    ],
)
def test_public_gpu_pool_lines(name: str, memory: float, tokens: int, max_len: int) -> None:
    info = parse_startup_log(FIXTURES / name)
    assert (info.available_kv_memory_gib, info.pool_tokens, info.max_concurrency_len) == (memory, tokens, max_len)
    assert info.device == "gpu" and info.failed is False


def test_every_public_fixture_names_its_source() -> None:
    logs = sorted(FIXTURES.glob("*.log"))
    assert len(logs) >= 4
    for path in logs:
        assert path.read_text().startswith("# source: https://github.com/"), path.name
