"""Fast checks of the server's ports and early refusals (no vLLM process)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import EngineStartError, VllmServer, free_port, port_is_free


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
