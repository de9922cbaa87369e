"""``kvstudy run-block``: one pair-block of a plan into ``STORE/<block-id>/``, run with the
experiment's own runner restricted to the block's seed, beside ``block.json`` (plan, record, node,
attempts). A block belongs to one node: once any cell has a result, another node is refused, so a
comparison is never split across machines. The node is its host, GPUs (UUID, driver, clocks through
nvidia-ml-py when present), CPU model, flags and clocks; ``node_id`` is what two runs compare to tell
one node from another.

``kvstudy run-blocks-ray``: a plan's blocks as Ray tasks that each run ``kvstudy run-block`` in a
subprocess and return its exit code; results are the files it writes into the store, never Ray's
object store (a multi-node cluster needs the project at the driver's paths). A local cluster binds
loopback only, without dashboard or usage statistics; an ``--address`` is probed with one TCP
connection first (one line at once instead of Ray's minutes of retries).
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal
from unittest.mock import patch

import psutil

from kvstudy import capture as capture_format
from kvstudy.bench.spec import checked
from kvstudy.distribute import plan
from kvstudy.distribute.plan import ENGINE_PACKAGES, Strict, check_block_id, experiment, plan_blocks, plan_index, typed
from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import read_json, write_json_atomic
from kvstudy.machine import NvmlUnavailable, hardware_info, nvml_session, nvml_text, package_versions
from kvstudy.model.config_fields import require_live
from kvstudy.progress import Progress

BLOCK_RECORD = capture_format.BLOCK_RECORD
PASSED_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE")
LOG_DIR = "ray-logs"
ADDRESS_PROBE_S = 5.0
# a local cluster: on loopback only (Ray's single-machine mode), reporting nothing anywhere
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
_ADDRESS = re.compile(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):([0-9]{1,5})", re.ASCII)


BlockId = Annotated[str, checked(check_block_id)]


def _gpu_clocks() -> list[dict[str, Any]]:
    """Per GPU: index, UUID and its clocks now and at most (MHz); none when NVML cannot be read."""
    try:
        with nvml_session() as pynvml:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                row: dict[str, Any] = {"index": i, "uuid": nvml_text(pynvml.nvmlDeviceGetUUID(handle))}
                for key, clock in (("sm", pynvml.NVML_CLOCK_SM), ("memory", pynvml.NVML_CLOCK_MEM)):
                    with suppress(Exception):  # a GPU that does not report this clock
                        row[f"{key}_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, clock)
                        row[f"{key}_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, clock)
                out.append(row)
            return out
    except NvmlUnavailable:  # no nvidia-ml-py, no driver, no library: a CPU node (hardware_info says why)
        return []


def _cpu_clock() -> dict[str, float] | None:
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError):
        return None
    return None if freq is None else {"current_mhz": freq.current, "min_mhz": freq.min, "max_mhz": freq.max}


def node_identity() -> dict[str, Any]:
    """This node as a block's record keeps it."""
    machine = asdict(hardware_info())
    gpus = _gpu_clocks()
    host = platform.node() or "unknown-host"
    uuids = [g["uuid"] for g in gpus]
    return {
        "node_id": host + (f" [{', '.join(uuids)}]" if uuids else ""),
        "host": host,
        "gpu_uuids": uuids,
        "gpu_driver": machine.get("gpu_driver"),
        "gpu_clocks": gpus,
        "nvml_error": machine["nvml_error"] if not gpus else None,
        "cpu_model": machine.get("cpu_model"),
        "cpu_flags": machine.get("cpu_flags"),
        "cpu_clock": _cpu_clock(),
        "machine": machine,
    }


class _PlanBlock(Strict):
    index: int
    block_id: BlockId
    experiment: str
    seed: int


class _Node(Strict):
    node_id: str | None = None


class _BlockRecord(Strict):
    """The fields of ``block.json`` the commands read, each of its type."""

    plan_id: str
    block_id: BlockId
    plan_blocks: list[_PlanBlock]
    record: plan.PlanRecord
    node: _Node
    status: Literal["running", "ok", "failed"]
    attempts: list[Any] = []


def read_block_record(folder: Path) -> dict[str, Any] | None:
    """A block folder's ``block.json``, the fields the commands read typed (None when there is none)."""
    path = folder / BLOCK_RECORD
    if not path.is_file():
        return None
    data: dict[str, Any] = read_json(path, finite=True)
    typed(_BlockRecord, data, str(path))
    return data


def store_blocks(store: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every block folder of a store (a folder with ``block.json``), with its record."""
    if not store.is_dir():
        return []
    folders = sorted(p for p in store.iterdir() if p.is_dir())
    return [(folder, record) for folder in folders if (record := read_block_record(folder)) is not None]


class _Inputs(Strict):
    model_digest: str | None = None


class _Manifest(Strict):
    """The fields of a block capture's manifest that run-block and collect read."""

    items: dict[str, str] = {}
    inputs: _Inputs | None = None
    sessions: list[dict[str, Any]] = []


def manifest_items(folder: Path, manifest: dict[str, Any] | None = None) -> dict[str, str]:
    """A block capture's item states (cell id -> ok, failed, running, missing), its manifest (read
    when not given) typed; none before its manifest."""
    if manifest is None and not (folder / capture_format.MANIFEST).is_file():
        return {}
    data = capture_format.read_manifest(folder) if manifest is None else manifest
    return typed(_Manifest, data, str(folder / capture_format.MANIFEST)).items


def block_state(
    plan_id: str, records: list[dict[str, Any]], record: dict[str, Any], node: dict[str, Any], attempts: list
) -> dict[str, Any]:
    """What ``block.json`` holds: the plan (its id and blocks), this block's record, its node, attempts."""
    return {
        "plan_id": plan_id,
        "plan_blocks": plan_index(records),
        "block_id": record["block_id"],
        "index": record["index"],
        "record": record,
        "node": node,
        "status": "running",
        "attempts": attempts,
    }


def run_block(
    plan_dir: str | Path,
    index: int,
    store: str | Path,
    retry_failed: bool = False,
    progress: Progress = print,
    how: str = "",
) -> str:
    """Run block ``index`` of the plan into ``store``; returns its status (``ok`` or ``failed``)."""
    plan_id, records, _ = plan_blocks(plan_dir, [index])
    record = records[index]
    store = Path(store)
    for other, held in store_blocks(store):
        if held["plan_id"] != plan_id:
            raise StudyError(
                f"{other / BLOCK_RECORD}: block {held['block_id']} belongs to plan {held['plan_id']}, "
                f"not this plan {plan_id}: one store per plan (use another --store)"
            )
    folder = store / record["block_id"]  # a block id read_plan checked: a folder name, no path
    if folder.is_symlink():
        raise StudyError(
            f"{folder}: the block's folder is a symlink; refusing to run a block through it "
            "(a block's capture is a plain folder in its store)"
        )
    node = node_identity()
    old = read_block_record(folder)
    if old is not None:
        ran_on = (old.get("node") or {}).get("node_id")
        if old.get("status") == "ok":
            progress(f"block {record['block_id']}: done on {ran_on} already; nothing run")
            return "ok"
        # a block whose cells have no result (ok or failed) yet may move to another node
        if ran_on != node["node_id"] and {"ok", "failed"} & set(manifest_items(folder).values()):
            raise StudyError(
                f"block {record['block_id']}: started on node {ran_on!r}, this is {node['node_id']!r}: a block "
                f"runs on one node (delete {folder} to run it here from the start)"
            )
        if not capture_format.needs_run(old.get("status"), retry_failed):  # failed: kept (ok returned above)
            progress(f"block {record['block_id']}: failed before, kept; run again with --retry-failed")
            return "failed"
    here = package_versions(ENGINE_PACKAGES)
    for name, version in (record.get("engine") or {}).items():
        if name in here and here[name] != version:
            raise StudyError(
                f"block {record['block_id']}: planned with {name} {version}, this node has {name} {here[name]} "
                "(install the planned version, or plan again on this engine)"
            )
    exp = experiment(record["experiment"], f"block {record['block_id']}")
    spec = exp.spec_type.from_dict(record["spec"], f"block {record['block_id']}: spec")
    require_live(spec.model)  # before the block is claimed for this node: a node without the engine claims nothing
    attempt: dict[str, Any] = {"started_utc": capture_format.now_utc(), "retry_failed": retry_failed}
    state = block_state(plan_id, records, record, node, [*((old or {}).get("attempts") or []), attempt])
    capture_format.check_new_capture(folder)  # a folder of the user's files is refused before block.json
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / BLOCK_RECORD, state, indent=1)
    how = how or f"kvstudy run-block {plan_dir} --index {index} --store {store}"
    progress(f"block {record['block_id']} ({record['experiment']}, seed {record['seed']}) on {node['node_id']}")
    try:
        exp.run(spec, folder, how=how, progress=progress, retry_failed=retry_failed)
    finally:
        items = manifest_items(folder)
        states = set(items.values())
        state["status"] = "ok" if states == {"ok"} else "failed" if states and states <= {"ok", "failed"} else "running"
        attempt.update(finished_utc=capture_format.now_utc(), items=items)
        write_json_atomic(folder / BLOCK_RECORD, state, indent=1)
    return str(state["status"])


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
