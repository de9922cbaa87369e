"""The STREAM-like probe returns a positive, finite figure (no timing assertions)."""

from __future__ import annotations

import math
from dataclasses import asdict

from kvstudy.context.sweep import measure_bandwidth


def test_probe_returns_a_positive_finite_figure() -> None:
    probe = measure_bandwidth(array_mib=32, repeats=2)
    for value in (probe.copy_gb_s, probe.triad_gb_s, probe.best_gb_s):
        assert value > 0 and math.isfinite(value)
    assert probe.array_bytes == 32 * 2**20 and probe.repeats == 2
    assert set(asdict(probe)) >= {"copy_gb_s", "triad_gb_s", "best_gb_s", "array_bytes", "repeats"}
