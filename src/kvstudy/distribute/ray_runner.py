"""``kvstudy run-blocks-ray``: a plan's blocks as Ray tasks, where Ray is installed.

Each task asks for the block's GPUs (``num_gpus`` from TP x PP) and does one thing: it runs
``kvstudy run-block PLAN --index I --store STORE`` as a subprocess and returns its exit code. Only
a block index, paths and that integer pass through Ray; every result is a file the block's run
writes into the store (read back by ``kvstudy collect``, never through Ray's object store). Ray
itself ships the small task function to its workers as Ray always does. On a multi-node cluster
every node needs the project and its environment at the driver's paths (a shared file system).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.distribute.plan import read_plan
from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.progress import Progress

PASSED_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE")
LOG_DIR = "ray-logs"


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
    try:
        import ray
    except ImportError:
        raise MissingPrerequisite(
            "ray is not installed here (requirements/engine-cpu.txt pins it)",
            "make engine",
        ) from None
    _, records = read_plan(plan_dir)
    chosen = list(range(len(records))) if indices is None else list(indices)
    for i in chosen:
        if not 0 <= i < len(records):
            raise StudyError(f"{plan_dir}/plan.jsonl: block index {i}: the plan has {len(records)} blocks")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
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
