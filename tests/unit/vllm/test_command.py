"""The server's command line and environment, and secrets kept out of its record and its log (no
vLLM process): loopback cannot be undone, every flag reaches the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.redact import scrub_file
from kvstudy.run_record import build_record
from kvstudy.vllm.command import (
    ServerConfig,
    backend_uses_env_var,
    build_command,
    check_server_args,
    log_secrets,
    server_environment,
)

PLANTED = "plantedSECRET-9f8e7d"


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
        cpu_kvcache_space_gib=4.0,
        env={"OMP_NUM_THREADS": "2"},
        extra_args=["--block-size", "32"],
    )
    cmd = build_command(cfg, 8123, python="py", vllm_version="0.32.0")
    # every ServerConfig field is a vLLM option of its name, except the ones that are not flags
    # (the CPU pool and env go to the environment, extra_args as given): a new field must be one or the other
    options = {a for a in cmd if a.startswith("--")}
    assert options == {
        "--model",
        "--kv-cache-dtype",
        "--attention-backend",
        "--num-gpu-blocks-override",
        "--kv-cache-memory-bytes",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--seed",
        "--enforce-eager",
        "--quantization",
        "--served-model-name",
        "--block-size",
        "--host",
        "--port",
    }
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


def test_config_to_dict_filters_its_env(tmp_path: Path) -> None:
    data = ServerConfig(model=str(tmp_path), env={"HF_TOKEN": "hf_x", "VLLM_X": "1"}).to_dict()
    assert data["env"] == {"VLLM_X": "1"} and data["kv_cache_dtype"] == "auto"


@pytest.mark.parametrize(
    "args",
    [
        ["--host", "0.0.0.0"],
        ["--host=0.0.0.0"],
        ["--port", "80"],
        ["--port=80"],
        ["--PORT", "80"],
        ["-port", "80"],
        ["--uds", "/tmp/x"],
    ],
)
def test_host_and_port_are_refused_in_any_spelling(args: list[str]) -> None:
    with pytest.raises(StudyError, match="set by the project|not an option of vLLM"):
        build_command(ServerConfig(model="m", extra_args=args), 8000)


def test_other_arguments_pass() -> None:
    args = ["--block-size", "16", "--enforce-eager", "--max_model_len=64", "--seed", "-1"]
    assert check_server_args(args, "extra_args") == args


def test_record_holds_no_planted_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SECRET_SOURCE", PLANTED)
    monkeypatch.setenv("HF_ENDPOINT", f"https://user:{PLANTED}@hub.example")
    config = ServerConfig(
        model=str(tmp_path),
        extra_args=["--api-key", PLANTED, f"--hf-token={PLANTED}"],
        env={
            "HF_TOKEN": PLANTED,
            "DATABASE_URL": f"postgres://admin:{PLANTED}@h/db",
            "VLLM_API_KEY": {"from_env": "MY_SECRET_SOURCE"},
        },
    )
    assert server_environment(config)["VLLM_API_KEY"] == PLANTED  # the child gets the value
    (tmp_path / "server.log").write_text("INFO start\n")
    record = build_record(config, tmp_path / "server.log")
    assert PLANTED not in json.dumps(record)
    assert record["asked"]["environment"]["VLLM_API_KEY"] == {"from_env": "MY_SECRET_SOURCE"}


def test_copied_log_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_TOKEN", "envplanted-123456")
    log = tmp_path / "server.log"
    log.write_text(f"non-default args: {{'api_key': ['{PLANTED}'], 'model': '/m'}}\nenvplanted-123456\nok\n")
    scrub_file(log, log_secrets(ServerConfig(model="m", extra_args=["--api-key", PLANTED])))
    text = log.read_text()
    assert PLANTED not in text and "envplanted-123456" not in text and "ok" in text
