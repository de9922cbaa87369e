"""The one grid engine (kvstudy.bench.grid) with a fake server and a toy experiment (no vLLM): order,
the done rule, failed starts, a server that stops, faults injected before a cell, max_servers,
progress lines and the capture files. The speed and context sweeps' own tests run it through them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvstudy import capture as capture_format
from kvstudy.bench import grid
from kvstudy.bench.result import RequestRecord
from kvstudy.bench.spec import Arm, Cell, CellResult, Run
from kvstudy.errors import StudyError
from kvstudy.progress import silent
from kvstudy.vllm import server as engine


@dataclass(frozen=True)
class ToyConfig:
    kv_cache_dtype: str
    seed: int


class FakeServer:
    """Stands in for VllmServer: records starts; an arm in ``fail`` does not start."""

    starts: list[str] = []
    fail: set[str] = set()

    def __init__(self, config: ToyConfig, log_path: Path, ready_timeout_s: float = 0) -> None:
        self.config, self.log_path, self.alive = config, Path(log_path), False
        self.base_url, self.model_name = "http://127.0.0.1:1", "fake"

    def __enter__(self) -> "FakeServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"server {self.config.kv_cache_dtype} {self.config.seed} token=hf_SecretValue123\n")
        FakeServer.starts.append(f"{self.config.kv_cache_dtype}:{self.config.seed}")
        if self.config.kv_cache_dtype in FakeServer.fail:
            raise engine.EngineStartError(
                "vLLM server exited with code 1 while starting;\n cause: FP8 KV cache needs AVX-512",
                self.log_path,
                None,
                "RuntimeError: Engine core initialization failed. hf_SecretValue123",
            )
        self.alive = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.alive = False

    def is_alive(self) -> bool:
        return self.alive


class ToySpec(grid.GridSpec):
    """Four starts (auto, fp8, fp8, auto) of two cells each, in alternating user order."""

    AXIS: ClassVar[str] = "users"
    CELL_KEY: ClassVar[str] = "users"
    model: str = "toy"
    arms: list[Arm] = [Arm(name="auto"), Arm(name="fp8", kv_cache_dtype="fp8")]
    seeds: list[int] = [0, 1]
    users: list[int] = [1, 2]
    server_env: dict[str, Any] = {}
    ready_timeout_s: float = 1.0

    def runs(self) -> list[Run]:
        return [Run("auto", 0), Run("fp8", 0), Run("fp8", 1), Run("auto", 1)]

    def cells(self) -> list[Cell]:
        return [Cell(r.arm, r.seed, n, "n") for i, r in enumerate(self.runs()) for n in ((1, 2) if i % 2 else (2, 1))]

    def server_config(self, run: Run) -> Any:
        return ToyConfig(run.arm, run.seed)

    def scrub(self) -> Callable[[str], str]:
        return lambda text: text.replace("hf_SecretValue123", "[redacted]")


def _failed(spec: ToySpec, cell: Cell, reason: str, tail: str) -> CellResult:
    return CellResult(
        cell_id=cell.id, kv_cache_dtype=cell.arm, seed=cell.seed, status="failed", reason=reason, log_tail=tail
    )


def run_toy(capture: Path, ran: list[str], fail_cell: str | None = None, **kwargs: Any) -> list[CellResult]:
    """The toy grid on the engine; ``fail_cell`` raises a StudyError."""

    def run_cell(spec: ToySpec, capture: Path, cell: Cell, server: Any, tokenizer: str | None) -> CellResult:
        ran.append(cell.id)
        if cell.id == fail_cell:
            raise StudyError(f"bench/{cell.id}.json: unreadable")
        grid.write_requests(capture, cell.id, [RequestRecord(0, 1.0, 5.0, 50.0, 1.0, [1.0], 8, 4)])
        return CellResult(cell_id=cell.id, kv_cache_dtype=cell.arm, seed=cell.seed, status="ok")

    manifest = kwargs.pop("manifest", None) or _manifest(capture)
    return grid.run_grid(ToySpec(), capture, manifest, run_cell, _failed, **{"progress": silent, **kwargs})


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> type[FakeServer]:
    FakeServer.starts, FakeServer.fail = [], set()
    monkeypatch.setattr(engine, "VllmServer", FakeServer)
    monkeypatch.setattr(grid, "require_live", lambda model: None)
    monkeypatch.setattr(capture_format, "machine_section", lambda: {"machine": {"cpu": "test"}, "versions": {}})
    return FakeServer


def _manifest(capture: Path) -> dict[str, Any]:
    manifest = capture_format.new_manifest("toy grid", {}, "test")
    capture_format.write_manifest(capture, manifest)
    return manifest


def test_runs_in_the_plans_order_and_a_rerun_runs_nothing(tmp_path: Path, fake_server: type[FakeServer]) -> None:
    ran: list[str] = []
    results = run_toy(tmp_path, ran)
    assert fake_server.starts == ["auto:0", "fp8:0", "fp8:1", "auto:1"]
    assert ran == [c.id for c in ToySpec().cells()] == [r.cell_id for r in results]
    assert ran[:4] == ["auto__s0__n2", "auto__s0__n1", "fp8__s0__n1", "fp8__s0__n2"]  # each start's own order
    run = json.loads((tmp_path / "runs" / "fp8__s0.json").read_text())
    assert run["status"] == "ok" and run["arm"] == "fp8" and "record" in run
    rows = (tmp_path / "requests" / "auto__s0__n2.jsonl").read_text().splitlines()
    assert [json.loads(r)["tpot_ms"] for r in rows] == [1.0]
    manifest = capture_format.read_manifest(tmp_path)
    assert manifest["complete"] is True and list(manifest["items"]) == ran
    ran.clear()
    assert run_toy(tmp_path, ran, manifest=manifest) == [] and ran == []
    assert len(fake_server.starts) == 4 and capture_format.read_manifest(tmp_path)["sessions"][-1]["items_to_run"] == []


def test_failed_start_fails_its_cells_with_reason_and_tail_and_others_go_on(
    tmp_path: Path, fake_server: type[FakeServer]
) -> None:
    fake_server.fail = {"fp8"}
    ran: list[str] = []
    lines: list[str] = []
    results = run_toy(tmp_path, ran, progress=lines.append)
    failed = {r.cell_id: r for r in results if r.status == "failed"}
    assert sorted(failed) == ["fp8__s0__n1", "fp8__s0__n2", "fp8__s1__n1", "fp8__s1__n2"]
    cell = json.loads((tmp_path / "cells" / "fp8__s1__n2.json").read_text())
    assert cell["reason"].startswith("server did not start: vLLM server exited")
    assert "needs AVX-512" in cell["reason"] and "\n" not in cell["reason"]
    assert cell["log_tail"] == "RuntimeError: Engine core initialization failed. [redacted]"
    run = json.loads((tmp_path / "runs" / "fp8__s0.json").read_text())
    assert run["status"] == "failed" and "AVX-512" in run["reason"] and "hf_Secret" not in json.dumps(run)
    assert ran == ["auto__s0__n2", "auto__s0__n1", "auto__s1__n1", "auto__s1__n2"]
    assert sum("the server did not start" in line for line in lines) == 2
    assert [line.split(" ")[1] for line in lines if line.startswith("cell ")] == [f"{i}/8" for i in range(1, 9)]
    assert capture_format.read_manifest(tmp_path)["complete"] is False


def test_a_failure_is_kept_and_runs_again_only_with_retry_failed(tmp_path: Path, fake_server: type[FakeServer]) -> None:
    ran: list[str] = []
    manifest = _manifest(tmp_path)
    run_toy(tmp_path, ran, fail_cell="fp8__s1__n1", manifest=manifest)
    cell = json.loads((tmp_path / "cells" / "fp8__s1__n1.json").read_text())
    assert cell["status"] == "failed" and "unreadable" in cell["reason"] and "server fp8 1" in cell["log_tail"]
    assert grid.cell_status(tmp_path, "fp8__s1__n1") == "failed"
    bench_log = tmp_path / "logs" / "fp8__s1__n1.bench.log"
    bench_log.write_text("first attempt")
    ran.clear()
    fake_server.starts = []
    assert run_toy(tmp_path, ran, manifest=manifest) == [] and ran == []
    again = run_toy(tmp_path, ran, manifest=manifest, retry_failed=True)
    assert [r.cell_id for r in again] == ["fp8__s1__n1"] and fake_server.starts == ["fp8:1"]
    assert (tmp_path / "logs" / "fp8__s1__n1.bench.attempt1.log").read_text() == "first attempt"
    assert (tmp_path / "logs" / "fp8__s1.server.attempt1.log").read_text().startswith("server fp8 1")
    assert capture_format.read_manifest(tmp_path)["complete"] is True


def test_a_server_that_stopped_fails_the_cells_left_to_it(tmp_path: Path, fake_server: type[FakeServer]) -> None:
    ran: list[str] = []

    def kill_before(cell: Cell, server: Any) -> None:
        if cell.id == "fp8__s0__n2":
            server.alive = False

    run_toy(tmp_path, ran, on_cell_start=kill_before)
    assert "fp8__s0__n2" not in ran and "fp8__s0__n1" in ran
    cell = json.loads((tmp_path / "cells" / "fp8__s0__n2.json").read_text())
    assert cell["status"] == "failed" and "stopped before this cell" in cell["reason"]
    assert "server fp8 0" in cell["log_tail"]


def test_max_servers_stops_after_that_many_starts_and_a_resume_goes_on(
    tmp_path: Path, fake_server: type[FakeServer]
) -> None:
    ran: list[str] = []
    manifest = _manifest(tmp_path)
    first = run_toy(tmp_path, ran, manifest=manifest, max_servers=1)
    assert fake_server.starts == ["auto:0"] and len(first) == 2
    assert grid.item_states(tmp_path, ["auto__s0__n1", "fp8__s0__n1"]) == {
        "auto__s0__n1": "ok",
        "fp8__s0__n1": "missing",
    }
    run_toy(tmp_path, ran, manifest=manifest)
    assert fake_server.starts == ["auto:0", "fp8:0", "fp8:1", "auto:1"] and len(ran) == 8


def test_nothing_to_run_starts_nothing_and_skips_the_live_checks(tmp_path: Path, fake_server: type[FakeServer]) -> None:
    ran: list[str] = []
    checks: list[str] = []
    manifest = _manifest(tmp_path)
    run_toy(tmp_path, ran, manifest=manifest, before_first_start=lambda: checks.append("x"))
    run_toy(tmp_path, ran, manifest=manifest, before_first_start=lambda: checks.append("y"))
    assert checks == ["x"]


def test_a_torn_cell_file_runs_again_and_a_non_object_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "a.json").write_text('{"status": "ok"')
    assert grid.cell_status(tmp_path, "a") == "missing" and grid.cell_record(tmp_path, "a") is None
    (tmp_path / "cells" / "a.json").write_text("[1]")
    with pytest.raises(StudyError, match=r"a.json: expected a JSON object at the top level, got list"):
        grid.cell_status(tmp_path, "a")
    assert grid.read_requests(tmp_path, "a") is None


# --------------------------------------------------------------------------- reading a capture


def _request(i: int, **change: Any) -> dict[str, Any]:
    row = {"index": i, "start_time_s": 10.0 + i, "ttft_ms": 5.0, "e2el_ms": 35.0, "tpot_ms": 10.0}
    return {**row, "itls_ms": [10.0, 10.0, 10.0], "input_len": 8, "output_len": 4, **change}


def _capture(tmp: Path) -> Path:
    """Two cells as the engine writes them: one ok (requests, clock samples), one failed; one start."""
    capture_format.write_manifest(tmp, {"kind": "toy", "spec": {}})
    grid.write_record(tmp / "cells" / "a__s0__n1.json", {"cell_id": "a__s0__n1", "arm": "a", "status": "ok"})
    grid.write_record(tmp / "cells" / "a__s0__n2.json", {"cell_id": "a__s0__n2", "arm": "a", "status": "failed"})
    (tmp / "requests" / "a__s0__n1.jsonl").parent.mkdir()
    (tmp / "requests" / "a__s0__n1.jsonl").write_text("".join(json.dumps(_request(i)) + "\n" for i in range(3)))
    (tmp / "telemetry").mkdir()
    sample = {"t_mono_s": 9.5, "t_wall_s": 1.0, "device": "cpu", "clock_mhz": 2000.0}
    (tmp / "telemetry" / "a__s0__n1.jsonl").write_text(json.dumps(sample) + "\n")
    grid.write_record(tmp / "runs" / "a__s0.json", {"status": "ok", "run_id": "a__s0"})
    return tmp


def test_read_capture_types_every_file_once_and_frames_the_ok_cells(tmp_path: Path) -> None:
    cap = grid.read_capture(_capture(tmp_path), "toy", ("cell_id", "arm"))
    ok, failed = cap.cells["a__s0__n1"], cap.cells["a__s0__n2"]
    assert ok.ok and [r.index for r in ok.requests] == [0, 1, 2]
    assert isinstance(ok.requests[0], RequestRecord) and ok.telemetry[0].clock_mhz == 2000.0
    assert failed.status == "failed" and failed.requests == ()
    assert cap.runs["a__s0"].status == "ok"
    cells, requests, telemetry = cap.to_frames()
    assert list(cells["cell_id"]) == ["a__s0__n1", "a__s0__n2"]
    assert list(requests["t_rel_s"]) == [0.0, 1.0, 2.0] and set(requests["arm"]) == {"a"}
    assert list(telemetry["t_rel_s"]) == [0.0]  # no bench window: from the cell's earliest sample
    with pytest.raises(StudyError, match="field 'kind' is 'toy', expected 'other'"):
        grid.read_capture(tmp_path, "other")
    with pytest.raises(
        StudyError, match=r"cells/a__s0__n1.json: no field 'seed'; expected a cell record with arm, seed"
    ):
        grid.read_capture(tmp_path, "toy", ("arm", "seed"))


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        (
            _request(1, e2el_ms="35"),
            r"a__s0__n1.jsonl:2: not a request record \(e2el_ms: expected a valid number, got '35'",
        ),
        (
            _request(1, itls_ms=[1.0, None]),
            r"a__s0__n1.jsonl:2: not a request record \(itls_ms\[1\]: expected a valid number, got None",
        ),
        (
            _request(1, output_len=4.5),
            r"a__s0__n1.jsonl:2: not a request record \(output_len: expected a valid integer, got 4.5",
        ),
        (_request(1, tokens=3), r"a__s0__n1.jsonl:2: not a request record \(tokens: "),
    ],
)
def test_a_bad_request_line_is_one_line_naming_the_file_line_and_field(
    tmp_path: Path, row: dict[str, Any], needle: str
) -> None:
    cap = _capture(tmp_path)
    (cap / "requests" / "a__s0__n1.jsonl").write_text(json.dumps(_request(0)) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(StudyError, match=needle):
        grid.read_capture(cap)


def test_torn_inline_and_missing_files(tmp_path: Path) -> None:
    cap = _capture(tmp_path)
    (cap / "cells" / "a__s0__n2.json").write_text('{"status": "ok"')  # torn: not run (the done rule's view)
    assert list(grid.read_capture(cap).cells) == ["a__s0__n1"]
    (cap / "requests" / "a__s0__n1.jsonl").write_text('{"index": 0, "ttft_ms": 5.0\n')
    with pytest.raises(StudyError, match=r"a__s0__n1.jsonl:1: not a request record \(Expecting"):
        grid.read_capture(cap)
    (cap / "requests" / "a__s0__n1.jsonl").unlink()
    with pytest.raises(StudyError, match=r"requests/a__s0__n1.jsonl: missing \(an ok cell keeps"):
        grid.read_capture(cap)
    grid.write_record(cap / "cells" / "a__s0__n1.json", {"status": "ok", "requests": [_request(0)]})
    with pytest.raises(
        StudyError,
        match=r"a__s0__n1.json: per-request rows inline, an older capture format; expected them in .*requests/a__s0__n1.jsonl",
    ):
        grid.read_capture(cap)
    (cap / "runs" / "a__s0.json").write_text("[]")
    (cap / "cells" / "a__s0__n1.json").unlink()
    with pytest.raises(StudyError, match=r"runs/a__s0.json: expected a JSON object"):
        grid.read_capture(cap)


def test_bench_cell_keeps_result_requests_and_server_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's result, its per-request records and a /metrics sampler's rows (none from a closed port)
    land where the capture keeps them; a failed client still leaves the samples."""
    from kvstudy.bench import client
    from kvstudy.bench.telemetry import ServerMetricsSampler

    result = {
        "duration": 1.0,
        "ttfts": [0.1],
        "latencies": [0.5],
        "itls": [[0.1] * 3],
        "output_lens": [4],
        "errors": [""],
    }
    monkeypatch.setattr(client, "run_bench", lambda *a, **k: result)
    server = type("S", (), {"base_url": "http://127.0.0.1:9", "model_name": "m"})()
    sampler = ServerMetricsSampler(server.base_url, 0.05, timeout_s=0.1)
    got, records = grid.bench_cell(tmp_path, "c1", None, server, None, 5.0, sampler)  # type: ignore[arg-type]
    assert got == result and [r.output_len for r in records] == [4]
    assert json.loads((tmp_path / "bench" / "c1.json").read_text()) == result
    assert grid.read_requests(tmp_path, "c1") == records
    assert (tmp_path / "telemetry" / "c1.metrics.jsonl").read_text() == ""

    def fail(*a: Any, **k: Any) -> dict[str, Any]:
        raise client.BenchError("vllm bench serve exited with status 1: boom")

    monkeypatch.setattr(client, "run_bench", fail)
    with pytest.raises(client.BenchError):
        grid.bench_cell(tmp_path, "c2", None, server, None, 5.0, ServerMetricsSampler(server.base_url, 0.05))  # type: ignore[arg-type]
    assert (tmp_path / "telemetry" / "c2.metrics.jsonl").is_file() and not (tmp_path / "bench" / "c2.json").exists()
