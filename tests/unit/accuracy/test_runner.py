"""Unit tests of the GSM8K runner's records, capture reading and report records (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy import capture, cli
from kvstudy.accuracy import configurations as cf
from kvstudy.accuracy import records as rec
from kvstudy.accuracy import runner as ge
from kvstudy.accuracy import verdicts as vt
from kvstudy.accuracy.configurations import GSM8K_FILTERS
from kvstudy.errors import StudyError
from kvstudy.io import write_jsonl_atomic
from kvstudy.report import tables as rt

ROOT = Path(__file__).resolve().parents[3]
PUBLISHED = ROOT / "data" / "published" / "gsm8k-l4-qwen3-8b.json"


def _sample(doc_id: int, flt: str, response: str, extracted: str, right: bool) -> dict:
    return {
        "doc_id": doc_id,
        "filter": flt,
        "target": f"steps\n#### {doc_id + 10}",
        "prompt_hash": f"hash{doc_id}",
        "resps": [[response]],
        "filtered_resps": [extracted],
        "exact_match": 1.0 if right else 0.0,
    }


def test_records_from_samples_joins_filters_per_question():
    samples = [
        _sample(1, "flexible-extract", "so 11", "11", True),
        _sample(0, "strict-match", "#### 10", "10", True),
        _sample(1, "strict-match", "so 11", "[invalid]", False),
        _sample(0, "flexible-extract", "#### 10", "10", True),
    ]
    records = rec.records_from_samples(samples)
    assert [r.doc_id for r in records] == [0, 1]
    assert records[1].target == "11" and records[1].response == "so 11"
    assert records[1].strict_answer == "[invalid]" and not records[1].strict_correct
    assert records[1].flexible_correct and records[1].flexible_answer == "11"
    assert rec.correctness(records, "strict-match") == {0: True, 1: False}
    assert rec.correctness(records, "flexible-extract") == {0: True, 1: True}


def test_a_response_holding_line_separators_reads_back(tmp_path):
    # U+2028, U+2029 and U+0085 are written unescaped (ensure_ascii=False): str.splitlines() cut there
    odd = "so\u2028the answer\u2029is\x85 #### 10"
    records = rec.records_from_samples([_sample(0, f, odd, "10", True) for f in GSM8K_FILTERS])
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, records)
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert rec.read_records(path) == records


def test_records_need_both_filters():
    with pytest.raises(StudyError, match="lacks filters"):
        rec.records_from_samples([_sample(0, "strict-match", "x", "x", False)])


def test_records_round_trip_and_bad_lines(tmp_path):
    records = rec.records_from_samples([_sample(0, f, "#### 10", "10", True) for f in GSM8K_FILTERS])
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, records)
    assert rec.read_records(path) == records
    path.write_text('{"doc_id": 0}\n')
    with pytest.raises(StudyError, match=r"records.jsonl:1: not an accuracy record \(expected the fields"):
        rec.read_records(path)


def test_settings_reject_bad_values():
    with pytest.raises(StudyError, match="primary_filter"):
        ge.EvalSettings(primary_filter="best-of-both")
    with pytest.raises(StudyError, match="^eval settings: n: expected greater than 0"):
        ge.EvalSettings.for_task(n=0)
    with pytest.raises(StudyError, match="^eval settings: num_fewshot: "):
        ge.EvalSettings.for_task(num_fewshot=True)
    with pytest.raises(StudyError, match="unknown"):
        cf.configurations(["bf16", "int4-kv"])


def test_random_weights_weak_baseline_is_no_arm_and_not_guarded(tmp_path):
    """A weak baseline on another model: used by the discrimination check only."""
    cap = _fake_capture(tmp_path, {"bf16": "1111111100", "bf16-repeat": "1111111100", "random-weights": "0000000000"})
    results = ge.load_capture(cap, ["bf16", "bf16-repeat", "random-weights"])
    pairs = vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)
    assert [r.label for r in pairs] == ["BF16, repeat"]
    guard = {r.label: r for r in vt.guard_rows(results, "bf16")}
    assert guard["random weights (tiny model)"].compared == "another model"
    disc = vt.discrimination(results, "bf16", "random-weights", "strict-match")
    assert disc.discriminates and disc.p_value == pytest.approx(0.5**8)
    # one server per model: the weak baseline never shares the run's server
    keys = {c.name: c.server_key() for c in cf.configurations(["bf16", "bf16-zero-shot", "random-weights"])}
    assert keys["bf16"] == keys["bf16-zero-shot"] != keys["random-weights"]


def _fake_capture(root: Path, patterns: dict[str, str], failed: dict[str, str] | None = None) -> Path:
    """A capture folder as run_group writes it, from strings of 1 (right) and 0 (wrong)."""
    (root / "manifest.json").write_text(json.dumps({"source": "test", "settings": {}}))
    for name, pattern in patterns.items():
        folder = root / name
        folder.mkdir(parents=True)
        shots = cf.CONFIGURATIONS[name].num_fewshot
        samples = [
            _sample(i, f, f"resp{ch}", "10" if ch == "1" else "[invalid]", ch == "1")
            for i, ch in enumerate(pattern)
            for f in GSM8K_FILTERS
        ]
        write_jsonl_atomic(folder / "records.jsonl", rec.records_from_samples(samples))
        (folder / "status.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "label": name,
                    "state": "ok",
                    "num_fewshot": 8 if shots is None else shots,
                    "settings": {"n": len(pattern)},
                }
            )
        )
    for name, diagnosis in (failed or {}).items():
        (root / name).mkdir(parents=True)
        (root / name / "status.json").write_text(
            json.dumps({"name": name, "label": name, "state": "failed", "diagnosis": diagnosis})
        )
    return root


def test_capture_tables_paired_and_discrimination(tmp_path):
    cap = _fake_capture(
        tmp_path,
        {"bf16": "1111111100", "fp8-kv": "1111110000", "bf16-zero-shot": "0000000000"},
        failed={"fp8-weights": "vLLM server exited with code 1; cause: fp8 not supported"},
    )
    results = ge.load_capture(cap, ["bf16", "fp8-weights", "fp8-kv", "bf16-zero-shot"])
    rows = vt.capture_rows(results, "strict-match")
    assert [r.state for r in rows] == ["ok", "failed", "ok", "ok"]
    assert rows[0].interval is not None and (rows[0].interval.correct, rows[0].interval.n) == (8, 10)
    assert rows[2].interval is not None and rows[2].interval.correct == 6
    assert rows[1].interval is None and rows[0].shots == 8
    assert rt.failure_lines(results) == [
        "FP8 weights (failed): vLLM server exited with code 1; cause: fp8 not supported"
    ]
    pairs = vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)
    assert [r.label for r in pairs] == ["FP8 KV cache"]  # the failed and zero-shot runs are left out
    counts = pairs[0].comparison.counts
    assert counts.baseline_only == 2 and counts.candidate_only == 0
    assert pairs[0].comparison.mcnemar_p == pytest.approx(0.5)
    assert "The paired test shows no difference" in vt.paired_sentence(pairs[0].comparison)
    disc = vt.discrimination(results, "bf16", "bf16-zero-shot", "strict-match")
    assert disc.discriminates and disc.p_value == pytest.approx(0.5**8)
    with pytest.raises(StudyError, match="no finished records"):
        vt.discrimination(results, "fp8-weights", "bf16-zero-shot", "strict-match")


def test_guard_table_without_records_says_so(tmp_path):
    cap = _fake_capture(tmp_path, {"bf16": "10", "fp8-kv": "10"})
    results = ge.load_capture(cap, ["bf16", "fp8-kv"])
    (row,) = vt.guard_rows(results, "bf16")
    assert row.compared == "no record" and not row.clean


def test_published_intervals_reproduced():
    checks = vt.published_checks(vt.load_published(PUBLISHED))
    assert [c.interval.correct for c in checks] == [459, 453, 454, 453]
    assert all(c.matches for c in checks)
    assert [(round(100 * c.interval.low, 1), round(100 * c.interval.high, 1)) for c in checks] == [
        (89.1, 93.9),
        (87.7, 92.9),
        (87.9, 93.0),
        (87.7, 92.9),
    ]


def test_published_mismatch_is_detected(tmp_path):
    data = json.loads(PUBLISHED.read_text())
    data["rows"][2]["published_wilson95_pct"] = [88.1, 93.0]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert [c.matches for c in vt.published_checks(vt.load_published(path))] == [True, True, False, True]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(source="captured"), "source"),
        (lambda d: d.update(n=0), "p.json: n: expected greater than 0"),
        (lambda d: d["rows"][0].pop("correct"), r"rows\[0\]"),
        (lambda d: d["rows"][1].update(correct=501), r"rows\[1\].correct"),
        (lambda d: d.update(baseline="int8"), "baseline"),
    ],
)
def test_published_bad_fields(tmp_path, change, message):
    data = json.loads(PUBLISHED.read_text())
    change(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StudyError, match=message):
        vt.load_published(path)


def test_cli_bad_input_exits_2_without_traceback(tmp_path, capsys):
    code = cli.main(["gsm8k", "--model", str(tmp_path), "--capture", str(tmp_path / "c"), "--configs", "bf16,nope"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kvstudy: error: configurations") and "Traceback" not in err


def test_result_state_is_ok_only_with_records_and_the_same_settings(tmp_path):
    settings = ge.EvalSettings(n=10)
    folder = tmp_path / "bf16"
    assert ge.result_state(folder, settings, 8) is None
    folder.mkdir()
    settings_then = {"n": 10, "task": ge.OFFLINE_TASK, "fewshot_seed": 1234}
    status = {"name": "bf16", "label": "BF16", "state": "ok", "num_fewshot": 8, "settings": settings_then}
    (folder / "status.json").write_text(json.dumps(status))
    assert ge.result_state(folder, settings, 8) is None  # ok but no records file: runs again
    write_jsonl_atomic(folder / "records.jsonl", [])
    assert ge.result_state(folder, settings, 8) == "ok"
    assert ge.result_state(folder, ge.EvalSettings(n=20), 8) is None  # more questions asked: run again
    assert ge.result_state(folder, settings, 0) is None  # other shots
    (folder / "status.json").write_text(json.dumps({**status, "state": "incomplete"}))
    assert ge.result_state(folder, settings, 8) == "incomplete"
    (folder / "status.json").write_text(json.dumps({**status, "state": "failed"}))
    assert ge.result_state(folder, settings, 8) == "failed"


def test_an_ok_configuration_without_records_is_run_again_not_reported_failed(tmp_path):
    settings = ge.EvalSettings(n=2)
    folder = tmp_path / "cap" / "bf16"
    folder.mkdir(parents=True)
    settings_then = {"n": 2, "task": ge.OFFLINE_TASK, "fewshot_seed": 1234}
    status = {"name": "bf16", "label": "BF16", "state": "ok", "num_fewshot": 8, "settings": settings_then}
    (folder / "status.json").write_text(json.dumps(status))
    lines: list[str] = []
    with pytest.raises(StudyError):  # it is scheduled: the run needs the engine and a model folder
        ge.run_missing(["bf16"], tmp_path / "model", tmp_path / "cap", settings, progress=lines.append)
    assert not any("failed before" in line or "kept" in line for line in lines)


def test_cached_answers_counts_lm_eval_cache(tmp_path):
    SqliteDict = pytest.importorskip("sqlitedict", reason="lm-eval's cache library comes with `make engine`").SqliteDict

    assert ge.cached_answers(tmp_path) == 0
    with SqliteDict(str(tmp_path / f"{ge.CACHE_PREFIX}_rank0.db"), autocommit=True) as db:
        db["a"], db["b"] = "x", "y"
    assert ge.cached_answers(tmp_path) == 2


def test_root_error_skips_warnings_and_wrappers(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "(APIServer pid=1) WARNING 11-29 [x.py:1] fd limits can cause `OSError: [Errno 24] Too many open files`\n"
        "(Worker pid=2) ERROR 11-29 [m.py:9] Traceback (most recent call last):\n"
        "(Worker pid=2) ERROR 11-29 [m.py:9] RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s)\n"
        "(EngineCore pid=3) ERROR 11-29 [core.py:1] Exception: WorkerProc initialization failed due to an exception\n"
    )
    assert ge.root_error(log) == "RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s)"
    log.write_text(
        "\x1b[0;36m(Worker pid=2)\x1b[0;0m \x1b[31mERROR\x1b[0m \x1b[90m11-29\x1b[0m "
        "ValueError: coloured, as under a notebook kernel\n"
    )
    assert ge.root_error(log) == "ValueError: coloured, as under a notebook kernel"
    log.write_text("(APIServer pid=1) INFO ready\n")
    assert ge.root_error(log) is None


def test_run_missing_starts_nothing_when_all_is_there(tmp_path):
    settings = ge.EvalSettings(n=2)
    cap = _fake_capture(
        tmp_path,
        {"bf16": "10", "bf16-zero-shot": "00"},
        failed={"fp8-kv": "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."},
    )
    for name in ("bf16", "bf16-zero-shot"):  # statuses as run_group writes them
        status = json.loads((cap / name / "status.json").read_text())
        status["settings"] = {"n": 2, "task": ge.OFFLINE_TASK, "fewshot_seed": 1234}
        (cap / name / "status.json").write_text(json.dumps(status))
    (cap / "fp8-kv" / "status.json").write_text(
        json.dumps(
            {"name": "fp8-kv", "label": "FP8 KV", "state": "failed", "diagnosis": "no AVX-512", "settings": {"n": 2}}
        )
    )
    lines: list[str] = []
    out = ge.run_missing(["bf16", "fp8-kv", "bf16-zero-shot"], tmp_path / "model", cap, settings, progress=lines.append)
    assert out == {}
    assert lines[0] == "bf16: done already, kept" and lines[1].startswith("fp8-kv: failed before")


def test_manifest_refuses_other_settings(tmp_path):
    from kvstudy.vllm.command import ServerConfig

    base = ServerConfig(model="m")
    ge.write_manifest(tmp_path, ["bf16"], "m", ge.EvalSettings(n=2), base)
    ge.write_manifest(tmp_path, ["fp8-kv"], "m", ge.EvalSettings(n=2), base)
    manifest = capture.read_manifest(tmp_path)
    assert [s["items_to_run"] for s in manifest["sessions"]] == [["bf16"], ["fp8-kv"]]
    with pytest.raises(StudyError, match="other settings"):
        ge.write_manifest(tmp_path, ["bf16"], "m", ge.EvalSettings(n=3), base)
