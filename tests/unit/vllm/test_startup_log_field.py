"""The startup-log parser on real logs from the field (issue 30 item 3, issue 35 item 9): multi-worker
pools (vLLM gives every worker the smallest), the root cause of a failed start in a worker's traceback
rather than its wrapper, the last attempt's cause after a rejected command line, a pydantic
ValidationError with its field, ROCm's sparse MLA line, FP8 chosen by the checkpoint, and a log saved
by PowerShell (UTF-16 LE with a byte-order mark, CRLF line ends)."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from kvstudy.vllm.startup_log import parse_startup_log, parse_startup_text, summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "startup-logs"
E = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [kv_cache_utils.py:1] "


def test_each_worker_logs_its_pool_and_the_engine_uses_the_smallest() -> None:
    """Two workers' lines in the 0.10-0.17 shape (written for this test from vLLM's log format; the
    figures are issue 30's): the pool is the smaller one, whatever order the lines come in."""
    lines = [
        "(VllmWorker TP0 pid=11) INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: 61.50 GiB",
        "(VllmWorker TP1 pid=12) INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: 60.70 GiB",
        E + "GPU KV cache size: 1,590,736 tokens",
        E + "Maximum concurrency for 32,768 tokens per request: 48.54x",
        E + "GPU KV cache size: 1,611,664 tokens",
        E + "Maximum concurrency for 32,768 tokens per request: 49.18x",
    ]
    info = parse_startup_text("\n".join(lines))
    assert info.pool_tokens == 1_590_736 and info.pool_tokens_logged == [1_590_736, 1_611_664]
    assert info.available_kv_memory_gib == pytest.approx(60.70) and info.max_concurrency == pytest.approx(48.54)
    assert "smallest (unify_kv_cache_configs)" in summary(info)
    reversed_order = parse_startup_text("\n".join([*lines[:2], *lines[4:], *lines[2:4]]))
    assert reversed_order.pool_tokens == 1_590_736


@pytest.mark.parametrize("name", ["vllm-25837-free-memory-worker.log", "vllm-33297-free-memory-cuda0.log"])
def test_free_memory_on_device_is_the_root_cause(name: str) -> None:
    info = parse_startup_log(FIXTURES / name)
    assert info.failed and "less free memory at startup" in (info.failure_cause or "")
    assert "Free memory on device" in (info.failure_cause or "")
    assert any("nvidia-smi" in a for a in info.advice)


def test_the_worker_traceback_not_the_wrapper_is_the_cause() -> None:
    """A worker's own exception, then the engine's wrapper (its text from vLLM's multiproc_executor.py
    and engine utils): the worker's is reported."""
    text = "\n".join(
        [
            "(VllmWorker TP1 pid=21355) ERROR 08-22 09:46:12 [multiproc_executor.py:559] KeyError: "
            "'model.layers.0.self_attn.q_proj.weight'",
            "(EngineCore_0 pid=21218) ERROR 08-22 09:46:16 [core.py:700] EngineCore failed to start.",
            "(EngineCore_0 pid=21218) ERROR 08-22 09:46:16 [core.py:700] Exception: WorkerProc initialization "
            "failed due to an exception in a background process. See stack trace for root cause.",
            "(APIServer pid=20948) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ]
    )
    info = parse_startup_text(text)
    assert info.failed and info.failure_cause == "KeyError: 'model.layers.0.self_attn.q_proj.weight'"


def test_rejected_flags_then_port_in_use_reports_the_last_attempt() -> None:
    """argparse exits before vLLM's banner; the wrapper's next start fails on the port: that is the cause."""
    text = "\n".join(
        [
            "usage: vllm serve [model_tag] [options]",
            "vllm serve: error: unrecognized arguments: --kv-cache-dtpye fp8",
            "INFO 01-01 00:00:01 [api_server.py:1] vLLM API server version 0.11.0",
            "ERROR 01-01 00:00:05 [launcher.py:1] OSError: [Errno 98] Address already in use",
        ]
    )
    info = parse_startup_text(text)
    assert info.attempts == 2 and info.failed
    assert (info.failure_cause or "").startswith("the port is already in use")
    only_flags = parse_startup_text("\n".join(text.splitlines()[:2]))
    assert only_flags.attempts == 1 and (only_flags.failure_cause or "").startswith("the server rejected")


def test_pydantic_validation_error_names_the_field() -> None:
    info = parse_startup_log(FIXTURES / "vllm-19660-validation-max-model-len.log")
    assert info.failed
    cause = info.failure_cause or ""
    assert cause.startswith("invalid engine argument ModelConfig.max_model_len: Value error, User-specified")
    assert "[type=" not in cause


def test_a_validation_error_with_a_location_line() -> None:
    text = "\n".join(
        [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            "block_size",
            "  Input should be 1, 8, 16, 32, 64 or 128 [type=literal_error, input_value=7, input_type=int]",
        ]
    )
    cause = parse_startup_text(text).failure_cause or ""
    assert cause == "invalid engine argument CacheConfig.block_size: Input should be 1, 8, 16, 32, 64 or 128"


@pytest.mark.parametrize("line", ["Using Sparse MLA backend.", "Using Sparse MLA backend on V1 engine."])
@pytest.mark.parametrize(
    "platform, backend",
    [
        ("INFO 01-01 00:00:00 [__init__.py:1] Automatically detected platform rocm.", "ROCM_AITER_MLA_SPARSE"),
        ("INFO 01-01 00:00:00 [__init__.py:1] Automatically detected platform cuda.", "FLASHMLA_SPARSE"),
    ],
)
def test_sparse_mla_line_is_a_backend(platform: str, backend: str, line: str) -> None:
    """vllm/platforms/rocm.py and cuda.py log "Using Sparse MLA backend." and name no backend."""
    info = parse_startup_text(f"{platform}\n{E}{line}\n")
    assert info.attention_backend == backend and info.attention_backend_source == "log"


def test_fp8_chosen_by_the_checkpoint_shows_in_the_backend_line() -> None:
    config = (
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with "
        "config: model='/models/Llama-3.1-70B-Instruct-FP8', dtype=torch.bfloat16, kv_cache_dtype=auto, "
        "device_config=cuda, max_seq_len=8192"
    )
    backend = E + (  # the format of vllm/v1/attention/backends/flashinfer.py (0.32)'s info_once line
        "FlashInfer resolved query dtypes: prefill=torch.bfloat16, decode=torch.bfloat16, "
        "decode_backend=flashinfer-native, kv_cache_dtype=torch.float8_e4m3fn, arch=sm90"
    )
    info = parse_startup_text(f"{config}\n{backend}\n")
    assert info.kv_cache_dtype == "fp8_e4m3" and info.kv_cache_dtype_config == "auto"
    assert "the checkpoint chose fp8_e4m3" in (info.kv_cache_dtype_source or "")
    plain = parse_startup_text(config)
    assert plain.kv_cache_dtype == "auto" and "engine config" in (plain.kv_cache_dtype_source or "")


def test_a_powershell_saved_log_is_read(tmp_path: Path) -> None:
    """PowerShell 5.1's ``>`` writes UTF-16 LE with a byte-order mark and CRLF line ends."""
    text = (FIXTURES / "lmcache-1739-qwen3-14b-gpu.log").read_text()
    saved = tmp_path / "powershell.log"
    saved.write_bytes(codecs.BOM_UTF16_LE + text.replace("\n", "\r\n").encode("utf-16-le"))
    info = parse_startup_log(saved)
    assert (info.pool_tokens, info.available_kv_memory_gib, info.max_concurrency_len) == (42_656, 6.51, 32_768)
    utf8_bom = tmp_path / "bom.log"
    utf8_bom.write_bytes(codecs.BOM_UTF8 + text.encode())
    assert parse_startup_log(utf8_bom).pool_tokens == 42_656
