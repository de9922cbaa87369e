"""The node identity a block records: host, CPU, and through nvidia-ml-py (a stand-in module here,
since the build machines have no GPU) each GPU's UUID, driver and clocks."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from kvstudy.distribute.block import node_identity


def _fake_nvml() -> types.ModuleType:
    """The nvidia-ml-py calls the node identity makes, answering like a one-GPU H200 machine."""
    nvml: Any = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM = 1, 2
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlSystemGetDriverVersion = lambda: b"570.86.15"
    nvml.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12080
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_109_880_320)
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nvml.nvmlDeviceGetUUID = lambda h: b"GPU-0a1b2c3d-0000-1111-2222-333344445555"
    nvml.nvmlDeviceGetClockInfo = lambda h, clock: {1: 1980, 2: 3201}[clock]
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, clock: {1: 1980, 2: 3201}[clock]
    return nvml


def test_gpu_node_is_its_host_and_gpu_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    node = node_identity()
    assert node["gpu_uuids"] == ["GPU-0a1b2c3d-0000-1111-2222-333344445555"]
    assert node["node_id"] == f"{node['host']} [GPU-0a1b2c3d-0000-1111-2222-333344445555]"
    assert node["gpu_driver"] == "570.86.15" and node["nvml_error"] is None
    assert node["gpu_clocks"][0]["sm_clock_mhz"] == 1980 and node["gpu_clocks"][0]["memory_clock_max_mhz"] == 3201
    assert node["machine"]["gpus"][0]["name"] == "NVIDIA H200"


def test_cpu_node_says_why_no_gpu_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: nvidia-ml-py not installed
    node = node_identity()
    assert node["node_id"] == node["host"] and node["gpu_uuids"] == []
    assert node["nvml_error"] == "nvidia-ml-py not installed"
    assert node["cpu_model"] and isinstance(node["cpu_flags"], list)
