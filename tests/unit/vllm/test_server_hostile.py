"""Issue 10: loopback cannot be undone, secrets stay out of records and logs, a killed run is reaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.cli import main as cli_main
from kvstudy.errors import StudyError
from kvstudy.run_record import build_record
from kvstudy.vllm.server import (
    ServerConfig,
    build_command,
    check_extra_args,
    reap_pid_file,
    scrub_log,
    server_environment,
    write_pid_file,
)
from kvstudy.vllm.startup_log import parse_startup_text

PLANTED = "plantedSECRET-9f8e7d"


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
    with pytest.raises(StudyError, match="set by the project"):
        build_command(ServerConfig(model="m", extra_args=args), 8000)


def test_other_arguments_pass() -> None:
    assert check_extra_args(["--block-size", "16", "--portable"]) == ["--block-size", "16", "--portable"]


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
    scrub_log(log, ServerConfig(model="m", extra_args=["--api-key", PLANTED]))
    text = log.read_text()
    assert PLANTED not in text and "envplanted-123456" not in text and "ok" in text


def test_pid_file_reaps_a_left_process_group(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        write_pid_file(tmp_path / "server.log.pids", child.pid)
        assert reap_pid_file(tmp_path / "server.log.pids")
        child.wait(timeout=60)  # generous: fails only if the sleeper survived (600 s)
        assert not (tmp_path / "server.log.pids").exists()
    finally:
        if child.poll() is None:
            child.kill()


def test_stale_or_broken_pid_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "x.pids").write_text(json.dumps({"pgid": os.getpid(), "create_time": 1.0}))
    assert not reap_pid_file(tmp_path / "x.pids")  # our own pid, another start time: not ours to kill
    (tmp_path / "y.pids").write_text("[1]")
    assert not reap_pid_file(tmp_path / "y.pids")


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A middle process starts a sleeper with die_with_parent and is SIGKILLed: the sleeper goes."""
    script = (
        "import subprocess, sys, time\nfrom kvstudy.vllm.server import die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], preexec_fn=die_with_parent)\n"
        "print(p.pid, flush=True)\ntime.sleep(600)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    import psutil

    grandchild = psutil.Process(int(middle.stdout.readline()))
    middle.kill()
    middle.wait(timeout=60)
    gone, _ = psutil.wait_procs([grandchild], timeout=60)  # generous: catches only a survivor
    assert gone


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
