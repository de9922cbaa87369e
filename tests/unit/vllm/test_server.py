"""Fast checks of the runner's command line, environment and early refusals (no vLLM process)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.vllm.server import (
    EngineStartError,
    ServerConfig,
    VllmServer,
    backend_uses_env_var,
    build_command,
    free_port,
    port_is_free,
    safe_environment,
    server_environment,
)


def test_command_carries_every_flag(tmp_path: Path) -> None:
    cfg = ServerConfig(
        model=str(tmp_path),
        kv_cache_dtype="fp8_e4m3",
        attention_backend="TRITON_ATTN",
        num_gpu_blocks_override=1506,
        kv_cache_memory_bytes=2**30,
        max_model_len=8192,
        gpu_memory_utilization=0.9,
        seed=3,
        enforce_eager=True,
        quantization="fp8",
        served_model_name="m",
        extra_args=["--block-size", "32"],
    )
    cmd = build_command(cfg, 8123, python="py", vllm_version="0.32.0")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in (
        f"--model {tmp_path.resolve()}",
        "--host 127.0.0.1",
        "--port 8123",
        "--kv-cache-dtype fp8_e4m3",
        "--attention-backend TRITON_ATTN",
        "--num-gpu-blocks-override 1506",
        f"--kv-cache-memory-bytes {2**30}",
        "--max-model-len 8192",
        "--gpu-memory-utilization 0.9",
        "--seed 3",
        "--enforce-eager",
        "--quantization fp8",
        "--served-model-name m",
        "--block-size 32",
    ):
        assert part in joined, part


def test_defaults_leave_unset_flags_out(tmp_path: Path) -> None:
    cmd = build_command(ServerConfig(model=str(tmp_path)), 1, python="py", vllm_version="0.32.0")
    assert "--enforce-eager" not in cmd and "--max-model-len" not in cmd and "--attention-backend" not in cmd
    assert cmd[cmd.index("--seed") + 1] == "0" and cmd[cmd.index("--kv-cache-dtype") + 1] == "auto"


def test_old_versions_pick_the_backend_by_environment(tmp_path: Path) -> None:
    cfg = ServerConfig(model=str(tmp_path), attention_backend="FLASHINFER", env={"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    assert backend_uses_env_var("0.11.0") and not backend_uses_env_var("0.14.0") and not backend_uses_env_var(None)
    assert "--attention-backend" not in build_command(cfg, 1, vllm_version="0.11.0")
    env = server_environment(cfg, base={}, vllm_version="0.11.0")
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert "VLLM_ATTENTION_BACKEND" not in server_environment(cfg, base={}, vllm_version="0.32.0")


def test_environment_is_offline_and_sets_the_cpu_pool(tmp_path: Path) -> None:
    env = server_environment(ServerConfig(model=str(tmp_path), cpu_kvcache_space_gib=1.0), base={"PATH": "/bin"})
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["PATH"] == "/bin"


@pytest.mark.parametrize("bad", [1.5, 0, -2, True])
def test_cpu_pool_must_be_whole_gib(tmp_path: Path, bad: float) -> None:
    with pytest.raises(StudyError, match="cpu_kvcache_space_gib"):
        server_environment(ServerConfig(model=str(tmp_path), cpu_kvcache_space_gib=bad), base={})


def test_safe_environment_drops_secrets() -> None:
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnop",
        "AWS_SECRET_ACCESS_KEY": "x",
        "MY_PASSWORD": "p",
        "GITHUB_AUTH": "a",
        "OPENAI_API_KEY": "sk-abc",
        "HARMLESS": "hf_abcdefghijklmnopq",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
    }
    assert safe_environment(env) == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def test_config_to_dict_filters_its_env(tmp_path: Path) -> None:
    data = ServerConfig(model=str(tmp_path), env={"HF_TOKEN": "hf_x", "VLLM_X": "1"}).to_dict()
    assert data["env"] == {"VLLM_X": "1"} and data["kv_cache_dtype"] == "auto"


def test_free_port_and_taken_port() -> None:
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not port_is_free(port)


def test_missing_model_folder_fails_before_any_process(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "missing.log"
    server = VllmServer(ServerConfig(model=str(tmp_path / "no-such-model")), log)
    with pytest.raises(EngineStartError, match="model folder not found") as err:
        server.start()
    assert server.pid is None and not server.is_alive()
    assert err.value.log_path == log and "model folder not found" in log.read_text()


def test_folder_without_config_fails_before_any_process(tmp_path: Path) -> None:
    server = VllmServer(ServerConfig(model=str(tmp_path)), tmp_path / "x.log")
    with pytest.raises(EngineStartError, match="no config.json"):
        server.start()
    assert server.pid is None


def test_taken_port_fails_before_any_process(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = VllmServer(ServerConfig(model=str(tmp_path)), tmp_path / "port.log", port=port)
        with pytest.raises(EngineStartError, match=f"port {port}: already in use"):
            server.start()
    assert server.pid is None
    assert "already in use" in (tmp_path / "port.log").read_text()


def test_engine_start_error_keeps_the_tail_readable() -> None:
    err = EngineStartError("server exited", Path("x.log"), None, "line one\nline two")
    assert "line one\nline two" in str(err) and err.args[0] == "server exited"
