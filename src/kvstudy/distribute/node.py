"""Which node ran a block: host, GPUs (UUID, driver, clocks through nvidia-ml-py when present),
CPU model and flags, clocks. ``node_id`` is what two runs compare to tell one node from another."""

from __future__ import annotations

import platform
from dataclasses import asdict
from typing import Any

import psutil

from kvstudy.machine import NvmlUnavailable, hardware_info, nvml_session, nvml_text


def _nvml_details() -> tuple[list[dict[str, Any]], str | None]:
    """Per GPU: index, UUID and its clocks now and at most (MHz); the error when NVML cannot be read."""
    try:
        with nvml_session() as pynvml:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                row: dict[str, Any] = {"index": i, "uuid": nvml_text(pynvml.nvmlDeviceGetUUID(handle))}
                for key, clock in (("sm", pynvml.NVML_CLOCK_SM), ("memory", pynvml.NVML_CLOCK_MEM)):
                    try:
                        row[f"{key}_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, clock)
                        row[f"{key}_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, clock)
                    except Exception:  # a GPU that does not report this clock
                        continue
                out.append(row)
            return out, None
    except NvmlUnavailable as exc:  # no nvidia-ml-py, no driver, no library: a CPU node
        return [], str(exc)


def _cpu_clock() -> dict[str, float] | None:
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError):
        return None
    return None if freq is None else {"current_mhz": freq.current, "min_mhz": freq.min, "max_mhz": freq.max}


def node_identity() -> dict[str, Any]:
    """This node as a block's record keeps it."""
    machine = asdict(hardware_info())
    gpus, nvml_error = _nvml_details()
    host = platform.node() or "unknown-host"
    uuids = [g["uuid"] for g in gpus]
    return {
        "node_id": host + (f" [{', '.join(uuids)}]" if uuids else ""),
        "host": host,
        "gpu_uuids": uuids,
        "gpu_driver": machine.get("gpu_driver"),
        "gpu_clocks": gpus,
        "nvml_error": nvml_error if not gpus else None,
        "cpu_model": machine.get("cpu_model"),
        "cpu_flags": machine.get("cpu_flags"),
        "cpu_clock": _cpu_clock(),
        "machine": machine,
    }
