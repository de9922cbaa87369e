"""Helpers for the speed-verdict tests: synthetic runs and real-format vLLM bench result files."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstudy.io import read_jsonl
from kvstudy.speed.measurability import RunRequests, assess_run, run_from_request_rows
from kvstudy.speed.verdict import RunSummary

ROOT = Path(__file__).resolve().parents[3]
BUNDLED_BENCH = ROOT / "data" / "captures" / "speed-cpu" / "bench"
BUNDLED_REQUESTS = ROOT / "data" / "captures" / "speed-cpu" / "requests"
BUNDLED_CELLS = ROOT / "data" / "captures" / "speed-cpu" / "cells"


def steady_run(
    name: str = "run", n: int = 8, out: int = 32, gap_s: float = 0.02, ttft_s: float = 0.1, **kw: Any
) -> RunRequests:
    """A run whose tokens arrive one decode step (``gap_s``) apart."""
    itl = tuple([gap_s] * (out - 1))
    return RunRequests(
        name=name,
        ttfts_s=(ttft_s,) * n,
        latencies_s=(ttft_s + gap_s * (out - 1),) * n,
        itls_s=(itl,) * n,
        output_lens=(out,) * n,
        success=(True,) * n,
        **kw,
    )


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


def bundled(name: str) -> dict[str, Any]:
    """One bundled vLLM 0.32 bench result (``bench/<name>.json``) as a dict."""
    return json.loads((BUNDLED_BENCH / f"{name}.json").read_text(encoding="utf-8"))


def bundled_cell(cell_id: str) -> dict[str, Any]:
    """One bundled cell record (``cells/<cell_id>.json``) as a dict."""
    return json.loads((BUNDLED_CELLS / f"{cell_id}.json").read_text(encoding="utf-8"))


def bundled_run(cell: dict[str, Any]) -> RunRequests:
    """The per-request rows of a bundled cell as a run (times in seconds)."""
    rows = read_jsonl(BUNDLED_REQUESTS / f"{cell['cell_id']}.jsonl")
    return run_from_request_rows(
        rows, cell["cell_id"], median_clock_mhz=cell["median_clock_mhz"], duration_s=cell["metrics"]["duration_s"]
    )


def measurable_cells(configuration: str, users: int) -> list[str]:
    """Ids of the bundled cells of ``configuration`` at ``users`` that ran and measured per-token
    latency, in seed order: chosen by reading the capture, so the tests follow a re-made capture."""
    found: list[tuple[int, str]] = []
    for path in sorted(BUNDLED_CELLS.glob("*.json")):
        cell = json.loads(path.read_text(encoding="utf-8"))
        if cell["configuration"] != configuration or cell["users"] != users or cell["status"] != "ok":
            continue
        m = assess_run(
            bundled_run(cell),
            expected_output_len=cell["settings"]["output_len"],
            clock_interval_s=cell["clock_interval_s"],
            clock_samples_in_window=cell["clock_samples_in_window"],
        )
        if m.measurable:
            found.append((int(cell["seed"]), str(cell["cell_id"])))
    return [cell_id for _, cell_id in sorted(found)]


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
def make_arms(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """Two folders of real-format results built from one bundled measurable run, ``n`` per arm, the
    candidate's times multiplied by ``ratio``; each run's baseline factor spreads by ``spread``.
    ``interleave`` alternates the arms in time (dates one minute apart), else all baseline first."""

    def make(
        n: int = 4, ratio: float = 1.0, spread: float = 0.02, interleave: bool = True, source: str | None = None
    ) -> tuple[Path, Path]:
        base_dir, cand_dir = tmp_path / "base", tmp_path / "cand"
        if source is None:  # the first measurable A/A-repeat run of the bundled capture
            source = next(iter(measurable_cells("auto-repeat", 4) + measurable_cells("auto-repeat", 1)))
        data = bundled(source)
        for i in range(n):
            f = math.exp(spread * (i - (n - 1) / 2) / max(n - 1, 1))
            tb = 2 * i if interleave else i
            tc = 2 * i + 1 if interleave else n + i
            write(base_dir, f"b{i}.json", scaled(data, f, f"20261129-09{tb:02d}00"))
            write(cand_dir, f"c{i}.json", scaled(data, f * ratio, f"20261129-09{tc:02d}00"))
        return base_dir, cand_dir

    return make


@pytest.fixture
def helpers() -> Any:
    """The helpers above, for tests (with --import-mode=importlib a conftest cannot be imported)."""
    import types

    return types.SimpleNamespace(
        steady_run=steady_run,
        summary=summary,
        bundled=bundled,
        scaled=scaled,
        write=write,
        bundled_cell=bundled_cell,
        bundled_run=bundled_run,
        measurable_cells=measurable_cells,
        BUNDLED_BENCH=BUNDLED_BENCH,
        BUNDLED_REQUESTS=BUNDLED_REQUESTS,
        BUNDLED_CELLS=BUNDLED_CELLS,
    )
