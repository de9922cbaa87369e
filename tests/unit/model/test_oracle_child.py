"""Issue 30 item 7: vLLM's specs asked only where the rules cannot answer, kept on disk by the config's
digest and vLLM's version, never asked to build past the rules' bounds, and a child that never
outlives its parent (kill -9, a timeout, Ctrl-C).

The child-process tests use a stand-in child module (it sleeps and records its pid), so they run
without vLLM; tests/live/test_capacity_vllm.py kills a real ``kvstudy capacity`` building with vLLM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from kvstudy.model import oracle
from kvstudy.vllm import kv_specs
from kvstudy.vllm.facts import KV_RULES_SOURCE

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
MODELS = ROOT / "data" / "models"


def _gone(pid: int, within: float = 60.0) -> bool:  # a generous bound: it only catches a survivor
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_rules_answer_where_they_can_and_vllm_is_asked_for_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake(configs: list[tuple[str, dict[str, Any]]], tps: tuple[int, ...]) -> dict[str, dict[str, Any]]:
        asked.extend(key for key, _ in configs)
        return {key: {"ok": False, "error": "vLLM is not installed here"} for key, _ in configs}

    monkeypatch.setattr(oracle, "read_specs", fake)
    monkeypatch.delenv("KVSTUDY_VLLM_SPECS", raising=False)
    qwen = oracle.resolve_layout(MODELS / "Qwen3-8B")
    assert qwen.source == KV_RULES_SOURCE and asked == []
    with pytest.raises(Exception, match="deepseek_v4"):
        oracle.resolve_layout(FIXTURES / "DeepSeek-V4-Flash")
    assert asked == [str(FIXTURES / "DeepSeek-V4-Flash" / "config.json")]
    monkeypatch.setenv("KVSTUDY_VLLM_SPECS", "always")
    oracle.resolve_layout(MODELS / "Qwen3-8B")
    assert asked[-1] == str(MODELS / "Qwen3-8B" / "config.json")


def test_answers_are_kept_on_disk_by_digest_and_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kv_specs, "oracle_disabled", lambda: None)
    monkeypatch.setattr(kv_specs, "_CACHE", {})
    monkeypatch.setattr(kv_specs.machine, "vllm_distribution", lambda: ("vllm", "9.9.9"))
    calls: list[int] = []

    def child(request: dict[str, Any], module: str = "") -> dict[str, Any]:
        calls.append(len(request["models"]))
        return {m["key"]: {"ok": False, "error": "built"} for m in request["models"]}

    monkeypatch.setattr(kv_specs, "run_child", child)
    config = json.loads((MODELS / "Qwen3-8B" / "config.json").read_text())
    first = kv_specs.read_specs([("a", config)], (1, 2))
    assert first["a"]["error"] == "built" and calls == [1]
    files = list((tmp_path / "vllm-specs").glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(kv_specs, "_CACHE", {})  # a new process: read back from disk, no child
    assert kv_specs.read_specs([("b", config)], (2, 1)) == {"b": first["a"]} and calls == [1]
    assert kv_specs.read_specs([("c", config | {"vocab_size": 1})], (1, 2))["c"]["error"] == "built"
    assert calls == [1, 1]
    monkeypatch.setattr(kv_specs.machine, "vllm_distribution", lambda: ("vllm", "9.9.10"))
    kv_specs.read_specs([("d", config)], (1, 2))  # another vLLM version: asked again
    assert calls == [1, 1, 1]
    files[0].write_text("{torn")  # a torn file is asked again, not trusted
    monkeypatch.setattr(kv_specs, "_CACHE", {})
    monkeypatch.setattr(kv_specs.machine, "vllm_distribution", lambda: ("vllm", "9.9.9"))
    kv_specs.read_specs([("e", config)], (1, 2))
    assert calls == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "change, said",
    [
        ({"num_hidden_layers": 10**9}, "at most 10,000 layers"),
        ({"n_routed_experts": 10**9}, "at most 1,000,000 experts"),
        ({"hidden_size": 2**60}, "no model has such a size"),
        ({"layer_types": ["full_attention"] * 20_000}, "lists 20,000 layers"),
        ({"text_config": {"num_hidden_layers": 10**12}}, "at most 10,000 layers"),
    ],
)
def test_vllm_is_never_asked_past_the_bounds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kv_specs, "oracle_disabled", lambda: None)

    def child(request: dict[str, Any], module: str = "") -> dict[str, Any]:
        raise AssertionError("the child must not start")

    monkeypatch.setattr(kv_specs, "run_child", child)
    config = json.loads((MODELS / "Qwen3-8B" / "config.json").read_text()) | change
    answer = kv_specs.read_specs([("m", config)], (1,))["m"]
    assert not answer["ok"] and said in answer["error"] and "\n" not in answer["error"]


STAND_IN = """
import os, sys, time
from pathlib import Path
def child():
    Path(os.environ["STAND_IN_PID"]).write_text(str(os.getpid()))
    time.sleep(600)
"""


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "stand_in_child.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("STAND_IN_PID", str(tmp_path / "child.pid"))
    return tmp_path / "child.pid"


def _wait_for(path: Path, within: float = 60.0) -> int:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never written")


def test_a_timed_out_child_is_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pid_file = _stand_in(tmp_path, monkeypatch)
    monkeypatch.setenv("KVSTUDY_VLLM_SPECS_TIMEOUT", "5")
    answer = kv_specs.run_child({"models": []}, module="stand_in_child")
    assert "timed out after 5 s" in answer["__error__"]
    assert _gone(_wait_for(pid_file, 1))


def _parent(**popen: Any) -> subprocess.Popen[bytes]:
    """A ``kvstudy`` process that runs the stand-in child through ``run_child``, with Python's own
    Ctrl-C handler: a test run started in the background inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler in its children (a terminal's Ctrl-C always reaches it)."""
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from kvstudy.vllm.kv_specs import run_child; run_child({}, module='stand_in_child')"
    )
    src = str(ROOT / "src")
    env = os.environ | {"PYTHONPATH": src + os.pathsep + os.environ["PYTHONPATH"]}
    return subprocess.Popen([sys.executable, "-c", code], env=env, **popen)


def test_the_child_dies_with_a_killed_parent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pid_file = _stand_in(tmp_path, monkeypatch)
    parent = _parent()
    try:
        child = _wait_for(pid_file)
        assert psutil.pid_exists(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert _gone(child), f"child {child} outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_ctrl_c_stops_the_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pid_file = _stand_in(tmp_path, monkeypatch)
    parent = _parent(stderr=subprocess.PIPE)
    try:
        child = _wait_for(pid_file)
        parent.send_signal(signal.SIGINT)
        parent.wait(timeout=60)
        assert _gone(child), f"child {child} outlived Ctrl-C"
    finally:
        if parent.poll() is None:
            parent.kill()
