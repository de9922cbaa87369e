"""Fast checks of the server's ports and early refusals (no vLLM process)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import EngineStartError, VllmServer, free_port


def test_free_port_and_taken_port() -> None:
    port = free_port()
    assert port is not None and free_port(port) == port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert free_port(port) is None


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


# --------------------------------------------------------------------------- an API key (issue 36)

# A stand-in for vLLM's API server as its AuthenticationMiddleware behaves: with VLLM_API_KEY in its
# environment (or --api-key KEY) every /v1 path needs "Authorization: Bearer KEY", else 401.
FAKE_SERVER = r"""
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
key = sys.argv[sys.argv.index("--api-key") + 1] if "--api-key" in sys.argv else os.environ.get("VLLM_API_KEY")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_response(401); self.end_headers(); return
        body = json.dumps({"data": [{"id": "fake"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import sys

    from kvstudy.vllm import server as server_module

    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(server_module, "vllm_distribution", lambda: ("vllm", "0.32.0"))
    monkeypatch.setattr(
        server_module,
        "build_command",
        lambda config, port, vllm_version=None: [sys.executable, str(script), *config.extra_args, "--port", str(port)],
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_an_api_key_exported_in_the_shell_does_not_stall_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import urllib.request

    from kvstudy.vllm import server as server_module

    model = _fake_vllm(tmp_path, monkeypatch)
    monkeypatch.setenv("VLLM_API_KEY", "user-shell-key-123")
    server_module._say_api_key_kept_out.cache_clear()
    # the fake asks for the key it inherits: a key passed on would refuse the study's clients (401)
    with VllmServer(ServerConfig(model=str(model)), tmp_path / "a.log", ready_timeout_s=60) as srv:
        assert srv.model_name == "fake" and "VLLM_API_KEY" not in srv.environment
        with urllib.request.urlopen(f"{srv.base_url}/v1/models", timeout=60) as resp:  # a client sends no key
            assert resp.status == 200
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "VLLM_API_KEY is set in this shell" in err[0] and "user-shell-key-123" not in err[0]


def test_a_key_the_spec_sets_is_sent_with_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_vllm(tmp_path, monkeypatch)
    monkeypatch.setenv("KVSTUDY_TEST_KEY_SOURCE", "spec-key-456")
    config = ServerConfig(model=str(model), env={"VLLM_API_KEY": {"from_env": "KVSTUDY_TEST_KEY_SOURCE"}})
    with VllmServer(config, tmp_path / "b.log", ready_timeout_s=60) as srv:
        assert srv.model_name == "fake"


def test_a_server_that_answers_401_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.error
    import urllib.request

    model = _fake_vllm(tmp_path, monkeypatch)
    monkeypatch.setattr(
        "kvstudy.vllm.server.check_server_args", lambda args, where: args
    )  # the fake's own option table
    refused: list[int] = []
    real_urlopen = urllib.request.urlopen

    def urlopen(*args: Any, **kwargs: Any) -> Any:
        assert not refused, "probed again after a 401: waiting cannot help"
        try:
            return real_urlopen(*args, **kwargs)
        except urllib.error.HTTPError as exc:
            refused.append(exc.code)
            raise

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    server = VllmServer(ServerConfig(model=str(model), extra_args=["--api-key", "k-789"]), tmp_path / "c.log", 600)
    with pytest.raises(EngineStartError, match="answered /v1/models with 401: it requires an API key"):
        server.start()
    assert refused == [401] and not server.is_alive()
