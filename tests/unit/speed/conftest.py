"""Helpers for the speed-verdict tests: run summaries and real-format vLLM bench result files.

The bench-layer helpers (synthetic runs, the bundled capture) come from ``tests/unit/conftest.py``;
the ``helpers`` fixture here adds these to them.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstudy.speed.verdict import RunSummary


def summary(
    name: str,
    median_s: float,
    *,
    spread: float = 0.05,
    n: int = 16,
    start: float | None = None,
    clock: float | None = None,
    seed: int = 0,
    measurable: bool = True,
) -> RunSummary:
    """A run summary with ``n`` per-request TPOTs scattered (log-normal) around ``median_s``."""
    rng = np.random.default_rng(seed)
    tpots = median_s * np.exp(rng.normal(0.0, spread, n))
    tpots *= median_s / float(np.median(tpots))  # exactly this median
    return RunSummary(
        name=name,
        tpots_s=tuple(float(t) for t in tpots),
        measurable=measurable,
        unmeasurable_reasons=() if measurable else ("synthetic: bursts",),
        start_time_s=start,
        median_clock_mhz=clock,
    )


def scaled(result: dict[str, Any], factor: float, date: str | None = None) -> dict[str, Any]:
    """A copy of a bench result with every per-request time multiplied by ``factor``."""
    out = copy.deepcopy(result)
    out["ttfts"] = [t * factor for t in out["ttfts"]]
    out["latencies"] = [t * factor for t in out["latencies"]]
    out["itls"] = [[g * factor for g in gaps] for gaps in out["itls"]]
    out["duration"] = out["duration"] * factor
    if date is not None:
        out["date"] = date
    return out


def write(folder: Path, name: str, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


@pytest.fixture
def helpers(helpers: Any) -> Any:
    """The shared helpers of ``tests/unit/conftest.py`` and the speed ones above."""
    import types

    return types.SimpleNamespace(**vars(helpers), summary=summary, scaled=scaled, write=write)


@pytest.fixture
def make_arms(tmp_path: Path, helpers: Any) -> Callable[..., tuple[Path, Path]]:
    """Two folders of real-format results built from one bundled measurable run, ``n`` per arm, the
    candidate's times multiplied by ``ratio``; each run's baseline factor spreads by ``spread``.
    ``interleave`` orders the arms ABBA in time (dates one minute apart), else all baseline first."""

    def make(
        n: int = 4, ratio: float = 1.0, spread: float = 0.02, interleave: bool = True, source: str | None = None
    ) -> tuple[Path, Path]:
        base_dir, cand_dir = tmp_path / "base", tmp_path / "cand"
        if source is None:  # the first measurable A/A-repeat run of the bundled capture
            source = next(iter(helpers.measurable_cells("auto-repeat", 4) + helpers.measurable_cells("auto-repeat", 1)))
        data = helpers.bundled(source)
        for i in range(n):
            f = math.exp(spread * (i - (n - 1) / 2) / max(n - 1, 1))
            tb = 2 * i + i % 2 if interleave else i  # ABBA: AB, BA, AB, ... (a block design)
            tc = 2 * i + 1 - i % 2 if interleave else n + i
            write(base_dir, f"b{i}.json", scaled(data, f, f"20261129-09{tb:02d}00"))
            write(cand_dir, f"c{i}.json", scaled(data, f * ratio, f"20261129-09{tc:02d}00"))
        return base_dir, cand_dir

    return make
