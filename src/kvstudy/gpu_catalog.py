"""A catalog of GPUs: memory as the driver reports it, memory bandwidth, FP8/FP4 support.

The figures live in ``data/gpus/catalog.json`` (sources in ``data/gpus/SOURCE.md``). Look a GPU up
by its name or an alias, in any case, with spaces, hyphens and underscores treated alike::

    spec = find_gpu("h100 sxm5 80gb")
    spec.memory_gib, spec.bandwidth_gb_s        # 79.65 GiB as nvidia-smi reports it, 3350 GB/s
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import REPO_ROOT, read_json

DEFAULT_CATALOG = REPO_ROOT / "data" / "gpus" / "catalog.json"

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "vendor": str,
    "architecture": str,
    "compute_capability": str,
    "aliases": list,
    "memory_type": str,
    "memory_marketing_gb": (int, float),
    "memory_mib_driver": int,
    "memory_confirmed": bool,
    "bandwidth_gb_s": (int, float),
    "bandwidth_confirmed": bool,
    "fp8_hardware": bool,
    "fp4_hardware": bool,
    "fp8_kv_note": str,
    "source": str,
}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Memory in the driver's units (MiB, GiB = 2**30 bytes); bandwidth in GB/s (10**9 B/s)."""

    name: str
    vendor: str
    architecture: str
    compute_capability: str  # "8.9" for NVIDIA, the gfx target for AMD
    aliases: tuple[str, ...]
    memory_type: str
    memory_marketing_gb: float  # what the vendor markets (decimal GB)
    memory_mib_driver: int  # nvidia-smi memory.total / rocm-smi VRAM total, in MiB
    memory_gib: float  # memory_mib_driver / 1024
    memory_confirmed: bool  # the driver figure was seen in a public listing
    cuda_total_bytes: int | None  # CUDA's own total where a listing was found (can be below the driver's)
    bandwidth_gb_s: float  # peak DRAM bandwidth from the vendor datasheet
    bandwidth_confirmed: bool
    fp8_hardware: bool  # FP8 tensor/matrix cores
    fp4_hardware: bool  # FP4 tensor cores
    fp8_kv_note: str  # what vLLM does with --kv-cache-dtype fp8 on this GPU
    source: str

    def to_dict(self) -> dict[str, Any]:
        """Fields as a JSON-ready dict (aliases as a list)."""
        out = asdict(self)
        out["aliases"] = list(self.aliases)
        return out


def normalize_name(name: str) -> str:
    """Lower case, with runs of spaces, hyphens and underscores made one space."""
    return re.sub(r"[\s_\-]+", " ", str(name).strip().lower())


def _spec_from_entry(entry: Any, where: str) -> GpuSpec:
    """Check one catalog entry and turn it into a GpuSpec."""
    if not isinstance(entry, dict):
        raise StudyError(f"{where}: expected an object per GPU, got {type(entry).__name__}")
    label = f"{where} ({entry.get('name', '?')})"
    for key, kind in _REQUIRED.items():
        value = entry.get(key)
        if not isinstance(value, kind) or (kind == (int, float) and isinstance(value, bool)):
            raise StudyError(f"{label}: field '{key}' is {value!r} (expected {kind})")
    if entry["memory_mib_driver"] <= 0 or entry["bandwidth_gb_s"] <= 0:
        raise StudyError(f"{label}: memory_mib_driver and bandwidth_gb_s must be positive")
    cuda_total = entry.get("cuda_total_bytes")
    if cuda_total is not None and (not isinstance(cuda_total, int) or cuda_total <= 0):
        raise StudyError(f"{label}: field 'cuda_total_bytes' is {cuda_total!r} (expected a positive integer or null)")
    fields = {key: entry[key] for key in _REQUIRED}
    fields.update(
        aliases=tuple(str(a) for a in entry["aliases"]),
        memory_marketing_gb=float(entry["memory_marketing_gb"]),
        bandwidth_gb_s=float(entry["bandwidth_gb_s"]),
        memory_gib=entry["memory_mib_driver"] / 1024,
        cuda_total_bytes=cuda_total,
    )
    return GpuSpec(**fields)


def load_catalog(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """Every GPU of the catalog file (default ``data/gpus/catalog.json``), keyed by canonical name."""
    where = Path(path) if path is not None else DEFAULT_CATALOG
    data = read_json(where)
    entries = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise StudyError(f"{where}: expected an object with a non-empty list 'gpus'")
    catalog: dict[str, GpuSpec] = {}
    seen: dict[str, str] = {}
    for i, entry in enumerate(entries):
        spec = _spec_from_entry(entry, f"{where} gpus[{i}]")
        for key in (spec.name, *spec.aliases):
            norm = normalize_name(key)
            if norm in seen and seen[norm] != spec.name:
                raise StudyError(f"{where}: name or alias {key!r} is used by both {seen[norm]} and {spec.name}")
            seen[norm] = spec.name
        catalog[spec.name] = spec
    return catalog


def find_gpu(name: str, path: str | Path | None = None) -> GpuSpec:
    """The GPU called ``name`` or one of its aliases (case, spaces, hyphens and underscores ignored)."""
    catalog = load_catalog(path)
    wanted = normalize_name(name)
    for spec in catalog.values():
        if wanted in {normalize_name(n) for n in (spec.name, *spec.aliases)}:
            return spec
    raise StudyError(f"gpu {name!r}: not in the GPU catalog (known: {', '.join(catalog)})")
