"""The decision card: every line comes from a notebook's verdict or says why there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy import cli, decision
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]
STEMS = ["01_capacity-math", "02_speed-sweep", "03_gsm8k-accuracy", "04_scale-inspection"]


def status() -> dict:
    return {
        "01_capacity-math": {
            "error": None,
            "verdicts": [
                {
                    "topic": "capacity",
                    "text": "2.00x the KV tokens per GiB",
                    "state": "computed",
                    "facts": {"model": "data/models/gpt-oss-20b", "context_len": 32768, "headline": "2.00x"},
                }
            ],
        },
        "02_speed-sweep": {"error": "needs what this machine lacks: vLLM; run `make engine`", "needs": "make engine"},
        "03_gsm8k-accuracy": {
            "error": None,
            "verdicts": [
                {
                    "topic": "accuracy",
                    "text": "FP8 -6 points",
                    "state": "measured",
                    "facts": {"fp8_accuracy_share": 0.9, "headline": "fp8 -6.0 points"},
                }
            ],
        },
    }


def test_card_lines_say_what_is_known_and_what_is_missing() -> None:
    card = decision.card_from_status("demo", status(), STEMS)
    lines = {line.topic: line for line in card.lines}
    assert lines["capacity"].state == "computed" and lines["accuracy"].state == "measured"
    assert lines["speed"].state == "not measured" and lines["speed"].next_step == "run `make engine`, then `make all`"
    assert lines["scales"].state == "not measured" and "not rendered yet" in lines["scales"].text
    assert "FP8 buys memory: 2.00x" in card.decision and "Measured: accuracy: fp8 -6.0 points" in card.decision
    assert "speed (not measured)" in card.decision


def test_published_guidance_is_evaluated_on_the_model() -> None:
    card = decision.card_from_status("demo", status(), STEMS)
    rows = {g.scenario.split(" (")[0]: g for g in card.guidance}
    assert rows["hybrid attention"].applies is True and "window 128" in rows["hybrid attention"].why
    assert rows["short contexts"].applies is False  # 32k is beyond the published break-even
    calibrate = next(g for g in card.guidance if g.scenario.startswith("accuracy below"))
    assert calibrate.applies is True and "90.0%" in calibrate.why
    assert "calibrate" in card.decision


def test_head_dim_256_and_an_unreadable_model(tmp_path: Path) -> None:
    cfg = json.loads((ROOT / "data" / "models" / "Qwen3-8B" / "config.json").read_text())
    cfg["head_dim"] = 256
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rows = decision.evaluate_guidance(str(tmp_path), 1024, None)
    assert next(g for g in rows if g.scenario.startswith("head_dim")).applies is True
    (bad,) = decision.evaluate_guidance(str(tmp_path / "absent"), 1024, None)
    assert bad.applies is None and "absent" in bad.why


def test_verdict_command_reads_a_rendered_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "demo.yaml").write_text(
        "description: d\nnotebooks:\n" + "".join(f"  {s}: {{}}\n" for s in STEMS)
    )
    with pytest.raises(StudyError, match="no rendered reports"):
        decision.read_card("demo", tmp_path)
    (tmp_path / "reports" / "demo").mkdir(parents=True)
    (tmp_path / "reports" / "demo" / "status.json").write_text(json.dumps(status()))
    card = decision.read_card("demo", tmp_path)
    assert card.model == "data/models/gpt-oss-20b" and len(card.lines) == 4


def test_verdict_command_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    if not (ROOT / "reports" / "reference" / "status.json").is_file():
        assert cli.main(["verdict", "reference"]) == 2  # one line: render first
        assert "make all PROFILE=reference" in capsys.readouterr().err
        return
    assert cli.main(["verdict", "reference", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["profile"] == "reference" and data["decision"] and data["lines"]
