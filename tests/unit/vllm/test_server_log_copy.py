"""The server's output reaches its log only scrubbed: never a secret on disk, even for a moment and
even when the orchestrator is SIGKILLed (no vLLM: a small Python script plays the server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import kvstudy.vllm.server as server_module
from kvstudy.redact import REDACTED, _cut_point, copy_scrubbed, start_scrubbed_copy
from kvstudy.vllm.server import ServerConfig, VllmServer

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
        assert server._log_copy is not None and server._log_copy.daemon  # never keeps the interpreter alive
    finally:
        server.stop()
    after = log.read_bytes()
    assert leaks(after) == [] and after.startswith(on_disk)
    assert after.endswith(f"partial ['--api-key', '{REDACTED}']".encode())  # the last line, at end of file
    assert not server._log_copy.is_alive()


def test_sigkill_of_the_parent_leaves_no_secret_on_disk(fake_vllm: Path, tmp_path: Path) -> None:
    """The orchestrator is SIGKILLed while its server keeps printing secrets: the log holds none,
    then or later, and the server goes with its parent."""
    log = tmp_path / "killed.log"
    command = server_module.build_command(planted_config(fake_vllm), 0)
    script = (
        "import sys, time\nimport kvstudy.vllm.server as s\n"
        "s.vllm_distribution = lambda: ('vllm', '0.0.0')\n"
        f"s.build_command = lambda config, port, **_: [sys.executable, {command[1]!r}, str(port), 'chatty', "
        "*config.extra_args]\n"
        f"config = s.ServerConfig(model={str(fake_vllm)!r}, extra_args=['--api-key', {PLANTED['extra_args']!r}], "
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


def test_copy_scrubs_lines_split_across_reads(tmp_path: Path) -> None:
    """A secret arriving in two writes, a \\r progress line, a long line cut between words, an
    unfinished last line: each reaches the file scrubbed, and everything else byte for byte."""
    read_end, write_end = os.pipe()
    target = tmp_path / "copy.log"
    source = os.fdopen(read_end, "rb")
    copy = start_scrubbed_copy(source, open(target, "wb"), ["plainSecretValue"])
    long_line = b"word " * 40 + b"--api-key plainSecretValue " + b"tail " * 40 + b"\n"
    for part in (
        b"start --api-ke",
        b"y sk-abcdefghij1234 x\nprogress 10%\r",
        b"progress 100%\r\nplainSecret",
        b"Value here\n" + long_line,
        b"\xf0\x9f\x98\x80 emoji, then an unfinished plainSecretValue",
    ):
        os.write(write_end, part)
        time.sleep(0.05)
    deadline = time.monotonic() + HANG_S
    while b"tail \n" not in target.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert b"plainSecretValue" not in target.read_bytes() and b"unfinished" not in target.read_bytes()
    os.close(write_end)
    copy.join(timeout=HANG_S)
    assert not copy.is_alive() and source.closed
    expected = (
        f"start --api-key {REDACTED} x\nprogress 10%\rprogress 100%\r\n{REDACTED} here\n".encode()
        + long_line.replace(b"plainSecretValue", REDACTED.encode())
        + f"\U0001f600 emoji, then an unfinished {REDACTED}".encode()
    )
    assert target.read_bytes() == expected


def test_long_lines_are_cut_between_words_and_keep_option_and_value_together(tmp_path: Path) -> None:
    line = b"x " * 30 + b"--api-key sk-" + b"A" * 40 + b" more"
    cut = _cut_point(line, 80)
    assert 40 <= cut <= 80 and line[cut:].startswith(b"--api-key sk-")
    assert _cut_point(b"A" * 100, 80) == 80  # no place between words: cut at the limit
    assert _cut_point(b"A" * 60 + b"/" + b"A" * 60, 80) == 61  # else after a byte outside a token
    read_end, write_end = os.pipe()
    with open(tmp_path / "long.log", "wb") as target:
        os.write(write_end, line * 3)  # no line end: written in pieces of at most 80 bytes
        os.close(write_end)
        copy_scrubbed(os.fdopen(read_end, "rb"), target, [], piece_bytes=80)
    text = (tmp_path / "long.log").read_bytes()
    assert b"sk-AAAA" not in text and text.count(REDACTED.encode()) == 3
    assert text == (line * 3).replace(b"sk-" + b"A" * 40, REDACTED.encode())


class BrokenTarget:
    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None: ...

    def close(self) -> None: ...


def test_a_failing_log_never_blocks_the_child() -> None:
    """The log cannot be written (disk full): the copy still drains the pipe to its end."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfor _ in range(2000): sys.stdout.write('x' * 4000 + '\\n')"],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    target: Any = BrokenTarget()
    copy = threading.Thread(target=copy_scrubbed, args=(child.stdout, target, []), daemon=True)
    copy.start()
    assert child.wait(timeout=HANG_S) == 0  # 8 MB through a 64 KiB pipe: it would block undrained
    copy.join(timeout=HANG_S)
    assert not copy.is_alive()
