"""``kvstudy accuracy compare`` and ``kvstudy accuracy totals``: output keys, figures, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvstudy import cli

BASE = {i: i % 9 != 0 for i in range(60)}
CAND = {i: BASE[i] != (i in (1, 2, 4, 5, 18)) for i in range(60)}  # 4 losses, 1 gain (i=18)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_json_pairs_files_in_different_orders(
    tmp_path: Path, lmeval: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    base = lmeval.write_samples(tmp_path, BASE, run="bf16")
    cand = lmeval.write_samples(tmp_path, dict(reversed(CAND.items())), run="fp8", shuffle_seed=3)
    code, out, err = run(["accuracy", "compare", str(base), str(cand), "--json", "--margin-points", "5"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)
    assert {"counts", "mcnemar_p", "interval", "non_inferiority", "verdict"} <= set(data)  # dataclasses.asdict
    counts = data["counts"]
    assert sum(counts.values()) == 60
    assert counts["both_right"] + counts["baseline_only"] == sum(BASE.values())
    assert counts["both_right"] + counts["candidate_only"] == sum(CAND.values())
    assert (counts["baseline_only"], counts["candidate_only"]) == (4, 1)
    assert data["mcnemar_p"] == pytest.approx(0.375)  # 2 * P(Bin(5, 1/2) <= 1) = 2 * 6/32
    low, high = data["interval"]["low"], data["interval"]["high"]
    assert low < (1 - 4) / 60 < high and high > 0
    assert isinstance(data["non_inferiority"]["non_inferior"], bool)
    assert data["non_inferiority"]["margin"] == pytest.approx(0.05)
    assert data["task"] == "gsm8k" and data["same_prompts"] is True
    assert "overlap" not in data["verdict"].lower()


def test_compare_filter_and_text_output(
    tmp_path: Path, lmeval: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    base = lmeval.write_samples(tmp_path, BASE, run="a")
    cand = lmeval.write_samples(tmp_path, CAND, run="b")
    code, out, _ = run(
        ["accuracy", "compare", str(base), str(cand), "--filter", "flexible-extract", "--margin-share", "0.99"], capsys
    )
    assert code == 0
    assert "items paired by doc_id: 60 (flexible-extract, exact_match)" in out
    assert "exact McNemar p" in out and "non-inferior at" in out


@pytest.mark.parametrize("case", ["task", "docs", "filter", "duplicate", "malformed", "directory"])
def test_compare_bad_input_is_one_line_and_exit_2(
    case: str, tmp_path: Path, lmeval: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    base = lmeval.write_samples(tmp_path, BASE, run="a")
    args = [str(base)]
    if case == "task":
        bad = lmeval.write_samples(tmp_path, BASE, task="arc_easy", run="b")
    elif case == "docs":
        bad = lmeval.write_samples(tmp_path, {i: True for i in range(1, 61)}, run="b")
    elif case == "filter":
        bad = lmeval.write_samples(tmp_path, BASE, run="b")
        args += ["--filter", "nope"]
    elif case == "duplicate":
        bad = lmeval.write_rows(
            tmp_path / "b" / f"samples_gsm8k_{lmeval.DATE}.jsonl", lmeval.rows_for(BASE) + [lmeval.gsm8k_row(3, True)]
        )
    elif case == "malformed":
        bad = tmp_path / "b" / f"samples_gsm8k_{lmeval.DATE}.jsonl"
        bad.parent.mkdir()
        bad.write_text('{"doc_id": 0,\n')
    else:
        bad = tmp_path
    code, out, err = run(["accuracy", "compare", *args[:1], str(bad), *args[1:], "--json"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1
    assert str(bad) in err or (case == "filter" and "'nope'" in err)


@pytest.mark.parametrize("candidate, p_min, rates", [("454", 0.0625, [1.0, 17.4]), ("453", 0.03125, [1.2, 17.6])])
def test_totals_json_published_figures(
    candidate: str, p_min: float, rates: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        ["accuracy", "totals", "--n", "500", "--baseline", "459", "--candidate", candidate, "--json"], capsys
    )
    assert code == 0
    data = json.loads(out)
    assert data["mcnemar_p_min"] == pytest.approx(p_min, rel=1e-12)
    assert data["mcnemar_p_max"] > 0.5
    assert [100 * data[k] / data["n"] for k in ("discordant_min", "discordant_max")] == pytest.approx(rates)
    low, high = data["detectable_loss_low"], data["detectable_loss_high"]
    assert round(100 * low, 1) == 1.6 and round(100 * high, 1) == 5.4
    ci_low, ci_high = data["unpaired"]["low"], data["unpaired"]["high"]
    assert ci_low < -0.01 < ci_high
    assert {"mcnemar_p_min", "mcnemar_p_max", "discordant_min", "detectable_loss_low", "unpaired", "verdict"} <= set(
        data
    )


def test_totals_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["accuracy", "totals", "--n", "500", "--baseline", "459", "--candidate", "454"], capsys)
    assert code == 0
    assert "exact McNemar p over all pairings: 0.0625 to 0.6683" in out


@pytest.mark.parametrize(
    "n, a, b, field",
    [
        ("500", "501", "3", "baseline"),
        ("500", "3", "-2", "candidate"),
        ("500", "4.5", "3", "--baseline"),
        ("ten", "3", "3", "--n"),
        ("0", "0", "0", "n"),
        ("500", "3", "1e2", "--candidate"),
    ],
)
def test_totals_bad_counts_are_one_line_and_exit_2(
    n: str, a: str, b: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["accuracy", "totals", "--n", n, "--baseline", a, "--candidate", b], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"kvstudy: error: {field}:") and err.count("\n") == 1


def test_bad_margin_is_one_line(tmp_path: Path, lmeval: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    base = lmeval.write_samples(tmp_path, BASE)
    code, _, err = run(["accuracy", "compare", str(base), str(base), "--margin-points", "abc"], capsys)
    assert code == 2 and err.startswith("kvstudy: error: ") and err.count("\n") == 1
    assert "--margin-points: expected a number from 0 to 100, got 'abc'" in err


def test_installed_command_prints_one_line_on_error() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstudy.cli",
            "accuracy",
            "totals",
            "--n",
            "500",
            "--baseline",
            "600",
            "--candidate",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "kvstudy: error: baseline: expected a count of correct items between 0 and n = 500, got 600"
    ]
