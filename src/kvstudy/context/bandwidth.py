"""A small STREAM-like probe of this machine's memory bandwidth (numpy copy and triad).

The roofline needs a bandwidth to predict from; on a CPU there is no datasheet figure for the
machine at hand, so measure one. Each kernel runs over arrays far larger than the last-level cache
and keeps its best of ``repeats`` runs (as STREAM does). Bytes counted per element: copy
``b[:] = a`` reads 8 and writes 8; triad ``a[:] = b + s * c`` reads 16 and writes 8 (numpy computes
it in two passes through a temporary-free ``out=`` form, so the real traffic is higher and the
figure is a lower bound). Write-allocate traffic is not counted, as in STREAM.
"""

from __future__ import annotations

import timeit
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_ARRAY_MIB = 128  # per array; three arrays (384 MiB) are well above common last-level caches
DEFAULT_REPEATS = 4


@dataclass(frozen=True)
class BandwidthProbe:
    """The best figures of a copy and a triad kernel, with how they were measured."""

    copy_gb_s: float
    triad_gb_s: float
    array_bytes: int  # size of each float64 array
    repeats: int
    threads_note: str  # numpy's element-wise kernels run on one thread

    @property
    def best_gb_s(self) -> float:
        """The larger of the two figures (decimal GB/s)."""
        return max(self.copy_gb_s, self.triad_gb_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "best_gb_s": self.best_gb_s}


def measure_bandwidth(array_mib: int = DEFAULT_ARRAY_MIB, repeats: int = DEFAULT_REPEATS) -> BandwidthProbe:
    """Copy and triad bandwidth in GB/s over float64 arrays of ``array_mib`` MiB each (best of ``repeats``)."""
    import numpy as np

    n = array_mib * 2**20 // 8
    a = np.full(n, 1.0)
    b = np.full(n, 2.0)
    c = np.full(n, 0.5)
    scalar = 3.0
    np.copyto(b, a)  # touch every page once before timing

    def copy() -> None:
        np.copyto(b, a)

    def triad() -> None:
        np.multiply(c, scalar, out=a)
        np.add(a, b, out=a)

    copy_s = min(timeit.repeat(copy, number=1, repeat=repeats))
    triad_s = min(timeit.repeat(triad, number=1, repeat=repeats))
    size = n * 8
    return BandwidthProbe(
        copy_gb_s=2 * size / copy_s / 1e9,
        triad_gb_s=3 * size / triad_s / 1e9,
        array_bytes=size,
        repeats=repeats,
        threads_note="numpy element-wise kernels use one thread: a single-core figure",
    )
