"""A catalog of GPUs: memory as the driver reports it, memory bandwidth, FP8/FP4 support.

The figures live in ``data/gpus/catalog.json`` (sources in ``data/gpus/SOURCE.md``). Look a GPU up
by its name or an alias, in any case, with spaces, hyphens and underscores treated alike::

    spec = find_gpu("h100 sxm5 80gb")
    spec.memory_gib, spec.bandwidth_gb_s        # 79.65 GiB as nvidia-smi reports it, 3350 GB/s
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvstudy.errors import StudyError
from kvstudy.io import REPO_ROOT, read_json

DEFAULT_CATALOG = REPO_ROOT / "data" / "gpus" / "catalog.json"


class GpuSpec(BaseModel):
    """One GPU model. Memory in the driver's units (MiB, GiB = 2**30 bytes); bandwidth in GB/s (10**9 B/s)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str
    vendor: str
    architecture: str
    compute_capability: str  # "8.9" for NVIDIA, the gfx target for AMD
    aliases: list[str]
    memory_type: str
    memory_marketing_gb: float  # what the vendor markets (decimal GB)
    memory_mib_driver: int = Field(gt=0)  # nvidia-smi memory.total / rocm-smi VRAM total, in MiB
    memory_confirmed: bool  # the driver figure was seen in a public listing
    cuda_total_bytes: int | None = Field(None, gt=0)  # CUDA's own total where listed (can be below the driver's)
    bandwidth_gb_s: float = Field(gt=0)  # peak DRAM bandwidth from the vendor datasheet
    bandwidth_confirmed: bool
    fp8_hardware: bool  # FP8 tensor/matrix cores
    fp4_hardware: bool  # FP4 tensor cores
    fp8_kv_note: str  # what vLLM does with --kv-cache-dtype fp8 on this GPU
    source: str

    @property
    def memory_gib(self) -> float:
        return self.memory_mib_driver / 1024


def normalize_name(name: str) -> str:
    """Lower case, with runs of spaces, hyphens and underscores made one space."""
    return re.sub(r"[\s_\-]+", " ", str(name).strip().lower())


def load_catalog(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """Every GPU of the catalog file (default ``data/gpus/catalog.json``), keyed by canonical name."""
    where = Path(path) if path is not None else DEFAULT_CATALOG
    data = read_json(where)
    entries = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise StudyError(f"{where}: expected an object with a non-empty list 'gpus'")
    catalog: dict[str, GpuSpec] = {}
    owner: dict[str, str] = {}  # each normalized name or alias: the GPU it names
    for i, entry in enumerate(entries):
        try:
            spec = GpuSpec.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            name = entry.get("name", "?") if isinstance(entry, dict) else "?"
            raise StudyError(
                f"{where} gpus[{i}] ({name}): field {'.'.join(map(str, err['loc']))!r}: {err['msg']}, "
                f"got {str(err.get('input'))[:40]!r}"
            ) from None
        for key in (spec.name, *spec.aliases):
            if (other := owner.setdefault(normalize_name(key), spec.name)) != spec.name:
                raise StudyError(f"{where}: name or alias {key!r} is used by both {other} and {spec.name}")
        catalog[spec.name] = spec
    return catalog


def find_gpu(name: str, path: str | Path | None = None) -> GpuSpec:
    """The GPU called ``name`` or one of its aliases (case, spaces, hyphens and underscores ignored)."""
    catalog = load_catalog(path)
    for spec in catalog.values():
        if normalize_name(name) in map(normalize_name, (spec.name, *spec.aliases)):
            return spec
    raise StudyError(f"gpu {name!r}: not in the GPU catalog (known: {', '.join(catalog)})")
