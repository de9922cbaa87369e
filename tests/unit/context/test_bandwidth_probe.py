"""The STREAM-like probe returns a positive, finite figure (no timing assertions)."""

from __future__ import annotations

import math

from kvstudy.context.bandwidth import measure_bandwidth


def test_probe_returns_a_positive_finite_figure() -> None:
    probe = measure_bandwidth(array_mib=32, repeats=2)
    for value in (probe.copy_gb_s, probe.triad_gb_s, probe.best_gb_s):
        assert value > 0 and math.isfinite(value)
    assert probe.array_bytes == 32 * 2**20 and probe.repeats == 2
    assert set(probe.to_dict()) >= {"copy_gb_s", "triad_gb_s", "best_gb_s", "array_bytes", "repeats"}
