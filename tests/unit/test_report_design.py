"""``kvstudy design``: runs per arm for a speed change, questions for a non-inferiority margin."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvstudy import cli
from kvstudy.report import design as report_design
from kvstudy.stats.binary_power import non_inferiority_questions
from kvstudy.stats.permutation import runs_needed, sign_flip_power

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "data" / "captures" / "speed-cpu"


def test_runs_needed_is_the_fewest_blocks_with_the_power() -> None:
    need = runs_needed(0.05, 0.10, simulations=1000)
    n = need.runs_per_arm
    assert n is not None and need.method.startswith("exact")
    assert sign_flip_power(0.05, 0.10, n, 0.05, 1000, 0) >= 0.8
    if n > 6:  # six blocks is the fewest that can reach p < 0.05 at all
        assert sign_flip_power(0.05, 0.10, n - 1, 0.05, 1000, 0) < 0.8
    # more noise needs more runs; a larger change fewer
    assert runs_needed(0.2, 0.10, simulations=400).runs_per_arm > n  # type: ignore[operator]
    assert runs_needed(0.05, 0.30, simulations=400).runs_per_arm == 6


def test_normal_approximation_beyond_the_exact_search() -> None:
    need = runs_needed(0.5, 0.05, simulations=200, max_exact=6)
    expected = math.ceil(((1.959964 + 0.841621) * 0.5 / math.log1p(0.05)) ** 2)
    assert need.method == "normal approximation" and need.runs_per_arm == expected


def test_speed_design_reads_the_capture_aa_noise() -> None:
    rows = report_design.runs_design("speed", [20.0], capture_dir=CAPTURE)
    assert [r.users for r in rows] == [1, 4]
    assert all(r.noise_state == "measured" and r.noise_origin.startswith("measured: A/A noise of") for r in rows)
    assert all(r.runs_per_arm for r in rows)
    assumed = report_design.runs_design("speed", [20.0])
    assert assumed[0].noise_state == "assumed" and assumed[0].noise_origin.startswith("assumed")
    assert assumed[0].noise_sd == report_design.ASSUMED_NOISE_SD


def test_non_inferiority_questions_against_a_simulation() -> None:
    # truly equal scores, 10 % discordance, margin 3 points: the planned N passes about 80 % of the time
    n = non_inferiority_questions(0.03, 0.10)
    rng = np.random.default_rng(1)
    b = rng.binomial(n, 0.05, 4000)
    c = rng.binomial(n - b, 0.05 / 0.95)  # candidate-only among the rest: same 5 % each way
    diff = (c - b) / n
    se = np.sqrt((b + c) / n - diff**2) / np.sqrt(n)
    passed = np.mean(diff - 1.959964 * se > -0.03)
    assert 0.75 < passed < 0.86


def test_accuracy_design_from_totals_spans_the_pairings() -> None:
    rows = report_design.accuracy_design([2.0], totals=[500, 440, 436])
    assert [round(r.discordance, 3) for r in rows] == [0.008, 0.248]
    assert rows[0].questions < rows[1].questions and "allowed by the totals" in rows[0].discordance_origin


def test_cli_prints_both_and_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["design", "speed", "--noise-sd", "0.05", "--change", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["noise_state"] == data[0]["noise_origin"] == "given" and data[0]["runs_per_arm"] >= 6
    assert cli.main(["design", "accuracy", "--discordance", "0.05", "--margin-points", "2"]) == 0
    assert "questions (discordance 5.0%, given" in capsys.readouterr().out
    assert cli.main(["design", "accuracy", "--discordance", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvstudy: error: design accuracy: argument --discordance")
    assert cli.main(["design", "speed", "--noise-sd", "x"]) == 2
    assert "--noise-sd" in capsys.readouterr().err


def test_bad_totals_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["design", "accuracy", "--totals", "500", "600", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--totals N BASE CAND: baseline" in err[0]


@pytest.mark.parametrize(
    "argv, option",
    [
        (["accuracy", "--margin-points", "1e-300"], "--margin-points: expected a number from 0.01 to 99"),
        (["accuracy", "--margin-points", *["1"] * 11], "--margin-points: 11 values, expected at most 10"),
        (["speed", "--noise-sd", "1e308"], "--noise-sd: expected a number above 0, at most 5"),
        (["speed", "--change", "1e-300"], "--change: expected a number from 0.01 to 900"),
        (
            ["speed", "--change", *[str(v % 900 + 1) for v in range(20_000)]],
            "--change: 20,000 values, expected at most 10",
        ),
        (["accuracy", "--totals", "1", "0", "0"], "--totals N BASE CAND: 0/1 and 0/1 allow no question"),
        (["accuracy", "--totals", "7", "7", "7"], "--totals N BASE CAND: 7/7 and 7/7 allow no question"),
        (["accuracy", "--totals", "1" * 5000, "1", "1"], "argument --totals: invalid int value"),
    ],
)
def test_numbers_at_the_edge_are_one_line_naming_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35 item 4: overflows, a hang on 20,000 values and totals allowing no disagreement."""
    assert cli.main(["design", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0], err


def test_speed_designs_are_bounded_as_a_product() -> None:
    with pytest.raises(report_design.StudyError, match=r"25 designs, expected at most 24"):
        report_design.runs_design("speed", [1.0] * 25, sd=0.05)
