"""``kvstudy run-blocks-ray``: a plan's blocks as Ray tasks that each run ``kvstudy run-block`` in a
subprocess and return its exit code; results are the files it writes into the store, never Ray's
object store (a multi-node cluster needs the project at the driver's paths). A local cluster binds
loopback only, without dashboard or usage statistics; an ``--address`` is probed with one TCP
connection first (one line at once instead of Ray's minutes of retries).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

from kvstudy.distribute.plan import plan_blocks
from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.progress import Progress

PASSED_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE")
LOG_DIR = "ray-logs"
ADDRESS_PROBE_S = 5.0
# a local cluster: on loopback only (Ray's single-machine mode), reporting nothing anywhere
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
_ADDRESS = re.compile(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):([0-9]{1,5})", re.ASCII)


def check_address(address: str) -> None:
    """A one-line StudyError unless something accepts a TCP connection at ``address``
    (``HOST:PORT`` or ``ray://HOST:PORT``; ``auto`` is left to Ray)."""
    if address == "auto":
        return
    match = _ADDRESS.fullmatch(address)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise StudyError(f"--address {address[:80]!r}: expected HOST:PORT or ray://HOST:PORT of a Ray cluster's head")
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=ADDRESS_PROBE_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StudyError(
            f"--address {address}: nothing answers there ({reason}); expected a running Ray cluster's head "
            "(`ray start --head` prints its address), or leave --address out to start a local cluster"
        ) from None


def _run_block_process(argv: list[str], cwd: str, env: dict[str, str], log: str) -> int:
    """The body of each Ray task: ``kvstudy run-block`` in a subprocess, its output in ``log``."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT).returncode


def run_blocks_ray(
    plan_dir: str | Path,
    store: str | Path,
    indices: Sequence[int] | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    retry_failed: bool = False,
    progress: Progress = print,
) -> dict[int, int]:
    """Schedule the blocks (all, or ``indices``) as Ray tasks; block index -> run-block's exit code."""
    _, records, chosen = plan_blocks(plan_dir, indices)
    if address and num_cpus:
        raise StudyError(f"--num-cpus {num_cpus}: only for a local cluster (the cluster at --address has its own)")
    if address:
        check_address(address)
    try:
        import ray
    except ImportError:
        raise MissingPrerequisite(
            "ray is not installed here (requirements/engine-cpu.txt pins it)",
            "make engine",
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:  # a local cluster bound to loopback only, no dashboard, no usage statistics. Only with Ray's
                # single-machine switch off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) is a node's address loopback
                # (else Ray resolves 127.0.0.1 to a reachable address); ``ray`` reads it on import, so the
                # module constant is set too; the raylet, its agents and workers inherit the environment
                constants = ray._private.ray_constants
                with patch.dict(os.environ, LOCAL_ENV), patch.object(constants, "ENABLE_RAY_CLUSTER", False):
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        except Exception as exc:  # Ray's own start or connect failure: one line, its logs named
            ray.shutdown()  # what it started before failing (GCS, agents) is stopped
            what = f"the cluster at --address {address}" if address else "a local Ray cluster"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise StudyError(
                f"{what} did not start or answer ({first}); Ray's logs: /tmp/ray/session_latest/logs"
            ) from None
    try:
        task = ray.remote(_run_block_process)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        refs: dict[int, Any] = {}
        for i in chosen:
            argv = [sys.executable, "-m", "kvstudy.cli", "run-block", str(plan_dir), "--index", str(i)]
            argv += ["--store", str(store)] + (["--retry-failed"] if retry_failed else [])
            log = str(Path(store).resolve() / LOG_DIR / f"{records[i]['block_id']}.log")
            gpus = int(records[i].get("gpus_per_block") or 0)
            refs[i] = task.options(num_gpus=gpus, num_cpus=1).remote(argv, os.getcwd(), env, log)
            progress(f"block {i} ({records[i]['block_id']}) scheduled on Ray with {gpus} GPU(s)")
        codes = {i: int(ray.get(ref)) for i, ref in refs.items()}
    finally:
        if started_here:
            ray.shutdown()
    for i, code in codes.items():
        progress(f"block {i} ({records[i]['block_id']}): run-block exited {code}")
    return codes
