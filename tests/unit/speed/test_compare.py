"""`kvstudy speed compare` on folders of real-format vLLM bench results, and every kind of bad input."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench import result as bench_result
from kvstudy.bench.result import read_result_file
from kvstudy.cli import main
from kvstudy.errors import StudyError
from kvstudy.speed.compare import run_from_result


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The sub-command through ``kvstudy``'s own entry point (its error handling included)."""
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bundled_aa_folders_give_no_claim(tmp_path: Path, helpers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Two measurable runs of each arm of the bundled A/A pair, at the first user count that has them
    (picked by reading the capture's cells, not by id)."""
    base, cand = tmp_path / "auto", tmp_path / "repeat"
    users = next(
        (
            u
            for u in (1, 4)
            if len(helpers.measurable_cells("auto", u)) >= 2 and len(helpers.measurable_cells("auto-repeat", u)) >= 2
        ),
        None,
    )
    assert users is not None, "the bundled capture has no user count with 2 measurable runs per A/A arm"
    for name in helpers.measurable_cells("auto", users)[:2]:
        helpers.write(base, f"{name}.json", helpers.bundled(name))
    for name in helpers.measurable_cells("auto-repeat", users)[:2]:
        helpers.write(cand, f"{name}.json", helpers.bundled(name))
    rc, out, _ = run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)
    assert rc == 0
    d = json.loads(out)["verdict"]  # the verdict's fields
    assert d["verdict"] == "no claim" and d["measurable"] is True
    assert d["runs"] == {"baseline": 2, "candidate": 2}
    assert d["p_value"] >= d["min_p_value"] == pytest.approx(1 / 3)
    assert len(d["tpot_ratio_ci"]) == 2 and d["tpot_ratio_ci"][0] < d["tpot_ratio"] < d["tpot_ratio_ci"][1]
    assert any("cannot reach significance" in r for r in d["reasons"])
    rc, text, _ = run_cli(["speed", "compare", str(base), str(cand)], capsys)
    assert rc == 0 and "verdict: no claim" in text


def test_real_format_speed_up_is_claimed(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=4, ratio=0.7)
    rc, out, _ = run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)
    d = json.loads(out)["verdict"]
    assert rc == 0 and d["verdict"] == "faster", d["reasons"]
    assert d["tpot_ratio"] == pytest.approx(0.7, rel=1e-6) and d["p_value"] == pytest.approx(2 / 70)
    assert d["tpot_ratio_ci"][1] < 1.0
    rc, out, _ = run_cli(["speed", "compare", str(cand), str(base), "--json"], capsys)
    assert json.loads(out)["verdict"]["verdict"] == "slower"


def test_arms_run_one_after_the_other_give_no_claim(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=4, ratio=0.7, interleave=False)
    d = json.loads(run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)[1])["verdict"]
    assert d["verdict"] == "no claim" and d["order_design"] == "grouped"
    assert any("drift cannot be told" in r for r in d["reasons"])


def test_identical_arms_with_enough_runs_state_the_detectable_change(
    make_arms: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    base, cand = make_arms(n=4, ratio=1.0, spread=0.1)
    d = json.loads(run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)[1])
    assert d["verdict"]["verdict"] == "no claim" and d["verdict"]["p_value"] == pytest.approx(1.0)
    assert d["detectable_change"] is not None
    assert any("80 % power" in r for r in d["verdict"]["reasons"])


def test_bursty_runs_are_not_measurable(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=4, ratio=0.7)
    for path in cand.glob("*.json"):
        data = json.loads(path.read_text())
        data["itls"] = [[0.0] * len(g) for g in data["itls"]]
        data["latencies"] = [t + 1e-5 for t in data["ttfts"]]
        path.write_text(json.dumps(data))
    d = json.loads(run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)[1])
    assert d["verdict"]["verdict"] == "no claim" and d["verdict"]["measurable"] is False
    assert all(not m["measurable"] for m in d["measurability"]["candidate"])


def test_clock_metadata_is_used(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=4, ratio=0.7)
    for folder, clock in ((base, "1000"), (cand, "1100")):
        for path in folder.glob("*.json"):
            data = json.loads(path.read_text())
            data["median_clock_mhz"] = clock  # as vllm bench serve --metadata median_clock_mhz=1000 stores it
            path.write_text(json.dumps(data))
    argv = ["speed", "compare", str(base), str(cand), "--json"]
    d = json.loads(run_cli(argv, capsys)[1])["verdict"]
    assert d["verdict"] == "no claim" and d["clock_ratio"] == pytest.approx(1.1)
    assert d["clock_adjusted_ratio"] == pytest.approx(0.77, rel=1e-6)
    d = json.loads(run_cli(argv + ["--clock-tolerance-pct", "12"], capsys)[1])["verdict"]
    assert d["verdict"] == "faster"


# --------------------------------------------------------------------------- bad input


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def _edit(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_not_a_bench_result(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    (cand / "c1.json").write_text(json.dumps({"results": {"gsm8k": 0.8}}))
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "not a vLLM bench serve result")


def test_saved_without_detailed(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    _edit(cand / "c0.json", itls=None, ttfts=None, output_lens=None, errors=None)
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c0.json", "--save-detailed")


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("max_concurrency", 8, "max_concurrency is 8"),
        ("model_id", "other/model", "model_id is 'other/model'"),
        ("num_prompts", 64, "num_prompts is 64"),
        ("request_rate", 2.0, "request_rate is 2.0"),
    ],
)
def test_mixed_settings(make_arms: Any, capsys: pytest.CaptureFixture[str], key: str, value: Any, needle: str) -> None:
    base, cand = make_arms(n=2)
    _edit(cand / "c1.json", **{key: value})
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", needle, "b0.json")


def test_mixed_lengths(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    data = json.loads((cand / "c0.json").read_text())
    _edit(cand / "c0.json", input_lens=[x * 4 for x in data["input_lens"]])
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c0.json", "input_len")
    base, cand = make_arms(n=2)
    _edit(cand / "c0.json", output_lens=[16 for _ in data["output_lens"]])
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c0.json", "output_len is 16")


def test_folder_with_one_run(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    (cand / "c1.json").unlink()
    (cand / "notes.txt").write_text("not a result")  # other names are ignored
    _bad(["speed", "compare", str(base), str(cand)], capsys, str(cand), "1 vLLM bench result", "at least 2")


def test_not_a_folder_and_same_folder(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    _bad(["speed", "compare", str(base / "b0.json"), str(cand)], capsys, "b0.json", "not a folder")
    _bad(["speed", "compare", str(base), str(base)], capsys, "same folder")


def test_unparsable_files(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    (cand / "c1.json").write_text("{not json")
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "malformed JSON")
    one = (cand / "c0.json").read_text()
    (cand / "c1.json").write_text(one + "\n" + one)  # --append-result
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "more than one JSON document")
    (cand / "c1.json").write_bytes(b"\xff\xfe\x00binary")
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "not UTF-8")
    (cand / "c1.json").write_text("[1, 2, 3]")
    _bad(
        ["speed", "compare", str(base), str(cand)],
        capsys,
        "c1.json",
        "expected a JSON object at the top level, got list",
    )


def test_huge_file(make_arms: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    base, cand = make_arms(n=2)
    monkeypatch.setattr(bench_result, "MAX_RESULT_BYTES", 1000)
    _bad(["speed", "compare", str(base), str(cand)], capsys, "b0.json", "bytes is larger than the 1000-byte limit")


def test_non_regular_files(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    (cand / "c1.json").unlink()
    (cand / "c1.json").mkdir()
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "is a directory")
    if hasattr(os, "mkfifo"):
        shutil.rmtree(cand / "c1.json")
        os.mkfifo(cand / "c1.json")
        _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "not a regular file")
    (cand / "c1.json").unlink()
    (cand / "c1.json").symlink_to(cand / "missing.json")
    _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "file not found")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    (cand / "c1.json").chmod(0)
    try:
        _bad(["speed", "compare", str(base), str(cand)], capsys, "c1.json", "cannot open")
    finally:
        (cand / "c1.json").chmod(0o644)


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("latencies", [], "ttfts has 24 entries, expected a list of 0"),
        ("ttfts", [0.1], "ttfts has 1 entries"),
        ("itls", "x", "itls: expected a valid list"),
        ("errors", [1] * 32, "errors[0]: expected a valid string"),
        ("duration", -1, "duration is -1"),
        ("num_prompts", "8", "num_prompts is '8'"),
        ("median_clock_mhz", "fast", "median_clock_mhz is 'fast'"),
    ],
)
def test_malformed_fields(helpers: Any, tmp_path: Path, key: str, value: Any, needle: str) -> None:
    data = helpers.bundled("auto-repeat__s1__u4")
    data[key] = value
    with pytest.raises(StudyError, match="x.json") as err:
        run_from_result(data, tmp_path / "x.json")
    assert needle in str(err.value)


def test_failed_requests_are_read_as_failed(helpers: Any, tmp_path: Path) -> None:
    data = helpers.bundled("auto-repeat__s1__u4")
    data["errors"][3] = "Internal Server Error"
    data["output_lens"][3] = 0
    run = run_from_result(data, tmp_path / "x.json")
    assert [r.success for r in run.requests].count(False) == 1 and run.start_time_s is not None


# --------------------------------------------------------------------------- property: the reader never crashes


def _json_values(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "float", "str", "none", "bool"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-5, 100)
    if kind == "float":
        return rng.choice([0.0, -1.5, 1e308, 3.25, 1e-9])
    if kind == "str":
        return rng.choice(["", "inf", "x", "20261129-090000"])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        return [_json_values(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["a", "itls", "latencies"]): _json_values(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _check_reader(data: Any, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    try:
        run_from_result(read_result_file(path), path)
    except StudyError as exc:
        assert "r.json" in str(exc)


def test_reader_raises_only_study_error_on_mutated_results(helpers: Any, tmp_path: Path) -> None:
    # seeded mutations of a real result: each key replaced by an arbitrary JSON value, or removed
    original = helpers.bundled("auto-repeat__s1__u4")
    rng = random.Random(0)
    for _ in range(300):
        data = json.loads(json.dumps(original))
        for key in rng.sample(sorted(data), rng.randint(1, 3)):
            if rng.random() < 0.2:
                del data[key]
            else:
                data[key] = _json_values(rng)
        _check_reader(data, tmp_path)


def test_reader_property_with_hypothesis(helpers: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    original = helpers.bundled("auto-repeat__s1__u4")
    folder = tmp_path_factory.mktemp("hyp")
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=10,
    )

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(key=st.sampled_from(sorted(original)), value=values)
    def prop(key: str, value: Any) -> None:
        data = dict(original)
        data[key] = value
        path = folder / "h.json"
        path.write_text(json.dumps(data))
        try:
            run_from_result(read_result_file(path), path)
        except StudyError as exc:
            assert "h.json" in str(exc)

    prop()


@pytest.mark.parametrize("as_json", [True, False])
def test_compare_never_echoes_a_url_password_or_token(
    make_arms: Any, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    base, cand = make_arms(n=4, ratio=0.7)
    for folder in (base, cand):
        for path in folder.glob("*.json"):
            _edit(
                path, model_id="https://user:plantedPw-4c1e9a@hub.example/m", tokenizer_id="org/hf_PlantedTok0123456789"
            )
    rc, out, _ = run_cli(["speed", "compare", str(base), str(cand), *(["--json"] if as_json else [])], capsys)
    assert rc == 0 and "plantedPw-4c1e9a" not in out and "hf_PlantedTok0123456789" not in out
    if as_json:
        assert json.loads(out)["verdict"]["verdict"] == "faster"


@pytest.mark.parametrize(
    "changes, needle",
    [
        (
            {"request_rate": math.inf},
            "request_rate is Infinity, expected a number above 0",
        ),  # JSON Infinity, not vLLM's "inf"
        ({"request_rate": -2.0}, "request_rate is -2.0"),
        ({"median_clock_mhz": "1e308"}, "median_clock_mhz is '1e308', expected a number above 0 and at most 100,000"),
        ({"median_clock_mhz": 1e308}, "median_clock_mhz is 1e+308"),
        ({"max_concurrency": -5}, "max_concurrency is -5, expected a whole number above 0"),
        ({"burstiness": 0}, "burstiness is 0"),
        ({"output_len": "1e12"}, "output_len is '1e12'"),
    ],
)
def test_run_settings_at_the_edge_are_one_line(
    make_arms: Any, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], needle: str
) -> None:
    """Issue 30's second corpus: Infinity under --json (a traceback), 1e308 MHz and -5 users (exit 0)."""
    base, cand = make_arms(n=2)
    _edit(cand / "c1.json", **changes)
    _bad(["speed", "compare", str(base), str(cand), "--json"], capsys, "c1.json", needle)


def test_vllm_inf_request_rate_is_read(make_arms: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = make_arms(n=2)
    for folder in (base, cand):
        for path in folder.glob("*.json"):
            _edit(path, request_rate="inf")
    rc, out, _ = run_cli(["speed", "compare", str(base), str(cand), "--json"], capsys)
    assert rc == 0 and json.loads(out)
