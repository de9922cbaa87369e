"""kvstudy kv-calibrate: bad grades are one line (the calibration itself: tests/unit/precision/test_divergence.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli

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

    from kvstudy.capture import new_manifest, set_items, write_manifest
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
    rc.write_group(folder, group)
    for arm, p in (("baseline", 0.6), ("baseline-repeat", 0.6), ("candidate", sure)):
        rc.write_logp(folder, "screen", arm, rows(p))
    manifest = new_manifest(rc.KIND, {"groups": ["screen"]}, "test", {"model": "m"})
    set_items(manifest, {"screen/candidate": "ok"})
    write_manifest(folder, manifest)
    return folder


def test_a_ladder_read_from_captures(tmp_path: Path) -> None:
    import math

    from kvstudy.accuracy import runner as ge
    from kvstudy.accuracy.records import correctness
    from kvstudy.report_calibration import calibrate_ladder
    from kvstudy.stats import binary as stats

    acc = CAPTURES / "gsm8k-cpu"
    grades = [(8.0, acc, _screen(tmp_path / "s8", 0.5)), (64.0, acc, _screen(tmp_path / "s64", 0.3))]
    ladder, cal = calibrate_ladder(grades, reference=acc)
    res = ge.load_capture(acc, ["bf16", "fp8-kv"])
    flt = ge.read_manifest(acc)["spec"]["settings"]["primary_filter"]
    expected = stats.compare(correctness(res["bf16"].records, flt), correctness(res["fp8-kv"].records, flt))
    assert ladder[0].change_points == pytest.approx(100 * expected.difference)
    assert ladder[0].bf16_change_points == 0.0  # the grade's 16-bit arm against the reference: the same run
    kl = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert ladder[1].kl == pytest.approx(kl) and ladder[1].delta_logp == pytest.approx(math.log(0.3 / 0.6))
    # both grades share the bundled capture, whose FP8 arm does not lose 2 points: no margin
    assert expected.difference > -0.02
    assert cal.state == "not calibrated" and cal.margin_kl is None and "no grade reaches" in cal.reason
