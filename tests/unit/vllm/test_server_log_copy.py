"""The server's output reaches its log only scrubbed: never a secret on disk, even for a moment and
even when the orchestrator is SIGKILLed (no vLLM: a small Python script plays the server)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import kvstudy.vllm.server as server_module
from kvstudy.errors import StudyError
from kvstudy.redact import REDACTED
from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import VllmServer

PLANTED = {
    "extra_args": "plantedArg-5f6a2b",
    "server_env": "plantedSrvEnv-44b2d0",
    "from_env": "plantedFromEnv-9d03f1",
    "environment": "plantedEnvTok-7c1a9e",
}
SHAPED = "hf_" + "Q" * 24  # token-shaped: redacted by its shape alone
HANG_S = 60  # generous bounds: they only catch a hang or a survivor

# Echoes its arguments and secret environment like vLLM, answers GET /v1/models, then either
# sleeps (a partial last line pending) or keeps printing its arguments ("chatty").
FAKE_SERVER = """
import http.server, json, os, sys, threading, time
port, mode, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
print("INFO non-default args: " + repr(args), flush=True)
for name in ("MY_SERVICE_TOKEN", "HF_TOKEN", "MY_ENV_SECRET_KEY"):
    print("DEBUG " + name + " is " + os.environ.get(name, "unset"), flush=True)
print("INFO token " + os.environ["SHAPED"] + " and bytes \\xff\\xfe follow:", flush=True)
sys.stdout.buffer.write(b"raw \\xff\\xfe end\\n")
sys.stdout.write("partial " + repr(args))
sys.stdout.flush()


class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "fake"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


httpd = http.server.HTTPServer(("127.0.0.1", port), Models)
if mode == "chatty":
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    while True:
        print("\\nINFO again " + repr(args), flush=True)
        time.sleep(0.05)
httpd.serve_forever()
"""


def planted_config(model: Path) -> ServerConfig:
    return ServerConfig(
        model=str(model),
        extra_args=["--api-key", PLANTED["extra_args"]],
        env={"MY_SERVICE_TOKEN": PLANTED["server_env"], "HF_TOKEN": {"from_env": "KVSTUDY_TEST_SOURCE"}},
    )


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The model folder; VllmServer runs the fake server instead of vLLM, with the planted secrets
    in its arguments, its config's env, a ``from_env`` reference and the parent environment."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("KVSTUDY_TEST_SOURCE", PLANTED["from_env"])
    monkeypatch.setenv("MY_ENV_SECRET_KEY", PLANTED["environment"])
    monkeypatch.setenv("SHAPED", SHAPED)
    monkeypatch.setattr(server_module, "vllm_distribution", lambda: ("vllm", "0.0.0"))
    monkeypatch.setattr(
        server_module,
        "build_command",
        lambda config, port, **_: [sys.executable, str(script), str(port), "sleep", *config.extra_args],
    )
    return model


def leaks(data: bytes) -> list[str]:
    return [channel for channel, value in {**PLANTED, "shaped": SHAPED}.items() if value.encode() in data]


def wait_for_log(log: Path, marker: bytes, count: int = 1) -> bytes:
    """The log once it holds ``marker`` ``count`` times (the copy thread may lag behind the
    server); every state of the file seen on the way holds no planted secret."""
    deadline = time.monotonic() + HANG_S
    while True:
        data = log.read_bytes()
        assert leaks(data) == [], data
        if data.count(marker) >= count:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.01)


def test_log_holds_only_scrubbed_lines_while_the_server_runs(fake_vllm: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = VllmServer(planted_config(fake_vllm), log, ready_timeout_s=HANG_S).start()
    try:
        on_disk = wait_for_log(log, b"raw \xff\xfe end\n")  # before stop(): what a SIGKILL now would leave
        assert b"non-default args" in on_disk and b"MY_SERVICE_TOKEN is" in on_disk, on_disk
        assert leaks(on_disk) == [] and on_disk.count(REDACTED.encode()) >= 5
        assert b"raw \xff\xfe end\n" in on_disk  # bytes that are not UTF-8 pass unchanged
        assert b"partial" not in on_disk  # a line without its end waits (it may go on with a secret)
        copy = next(t for t in threading.enumerate() if t.name == f"kvstudy-log-{server.pid}")
        assert copy.daemon  # never keeps the interpreter alive
    finally:
        server.stop()
    after = log.read_bytes()
    assert leaks(after) == [] and after.startswith(on_disk)
    assert after.endswith(f"partial ['--api-key', '{REDACTED}']".encode())  # the last line, at end of file
    assert not copy.is_alive()


def test_sigkill_of_the_parent_leaves_no_secret_on_disk(fake_vllm: Path, tmp_path: Path) -> None:
    """The orchestrator is SIGKILLed while its server keeps printing secrets: the log holds none,
    then or later, and the server goes with its parent."""
    log = tmp_path / "killed.log"
    fake_server = str(tmp_path / "fake_server.py")
    script = (
        "import sys, time\nimport kvstudy.vllm.server as s\nfrom kvstudy.vllm.command import ServerConfig\n"
        "s.vllm_distribution = lambda: ('vllm', '0.0.0')\n"
        f"s.build_command = lambda config, port, **_: [sys.executable, {fake_server!r}, str(port), 'chatty', "
        "*config.extra_args]\n"
        f"config = ServerConfig(model={str(fake_vllm)!r}, extra_args=['--api-key', {PLANTED['extra_args']!r}], "
        f"env={{'MY_SERVICE_TOKEN': {PLANTED['server_env']!r}, 'HF_TOKEN': {{'from_env': 'KVSTUDY_TEST_SOURCE'}}}})\n"
        f"server = s.VllmServer(config, {str(log)!r}, ready_timeout_s={HANG_S}).start()\n"
        "print(server.pid, flush=True)\ntime.sleep(600)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server: psutil.Process | None = None
    try:
        assert middle.stdout is not None
        server = psutil.Process(int(middle.stdout.readline()))
        wait_for_log(log, b"INFO again", count=5)  # it keeps printing
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=HANG_S)
        gone, _ = psutil.wait_procs([server], timeout=HANG_S)
        assert gone  # die_with_parent: the server goes with the orchestrator
        on_disk = log.read_bytes()
        assert leaks(on_disk) == [] and REDACTED.encode() in on_disk
    finally:
        if middle.poll() is None:
            middle.kill()
        if server is not None and server.is_running():
            server.kill()


def test_a_planted_symlink_at_the_server_log_is_refused(fake_vllm: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    log = tmp_path / "server.log"
    log.symlink_to(outside)
    with pytest.raises(StudyError, match="server.log: is a symlink"):
        VllmServer(planted_config(fake_vllm), log, ready_timeout_s=HANG_S).start()
    assert outside.read_text() == "keep me\n"
