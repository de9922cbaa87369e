"""The decision card of real renders: test profiles of capacity and scales only (tests/fixtures/profiles:
Mistral-7B on an L4, Gemma-3-27B on an H100 at 32k, Llama-3.3-70B on one H100 at 32k, Qwen3-8B on an L4)
say "Not decided yet" and name what to run, and the card's users are 01's own numbers (its GPUs x TP
table, written as CSV beside its figures)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from kvstudy import decision_rule as rule
from kvstudy.report import decision, render

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "profiles"

pytestmark = pytest.mark.notebooks


def study_copy(root: Path, profile: str) -> Path:
    """A copy of the repository (links) whose profiles/ also holds the test profile."""
    for entry in ROOT.iterdir():
        if entry.name not in {"reports", "figures", ".git", "profiles"}:
            (root / entry.name).symlink_to(entry)
    (root / "profiles").mkdir()
    shutil.copy(FIXTURES / f"{profile}.yaml", root / "profiles" / f"{profile}.yaml")
    return root


@pytest.mark.parametrize(
    "profile, gpu, tp",
    [
        ("llama-70b-h100", "H100-SXM", 2),  # TP 1 does not fit the weights: the TP the GPUs x TP table gives
        ("gemma-3-27b-h100", "H100-SXM", 1),
        ("mistral-7b-l4", "L4", 1),
        ("qwen3-8b-l4", "L4", 1),
    ],
)
def test_capacity_only_profiles_are_not_decided_and_agree_with_01(
    tmp_path: Path, profile: str, gpu: str, tp: int
) -> None:
    root = study_copy(tmp_path, profile)
    runs = render.run_profile(profile, root=root)
    assert all(r.error is None for r in runs), [r.error for r in runs]
    card = decision.read_card(profile, root)
    assert card.decision.answer == rule.UNDECIDED and card.headline.startswith("Not decided yet")
    runs_text = " ".join(m["run"] for m in card.missing)
    assert "08_load-at-equal-memory" in runs_text and "questions" in runs_text  # what to run, and its cost
    users = next(r for r in card.rows if r.quantity.startswith("Users that fit"))
    assert f"TP {tp}" in users.quantity and gpu in users.quantity
    with (root / "figures" / profile / "01-gpus-by-tp.csv").open(encoding="utf-8") as handle:
        table = {(row["GPU"], int(row["TP"])): row for row in csv.DictReader(handle)}
    row = table[(gpu, tp)]
    assert users.baseline == f"{int(float(row['users bfloat16'])):,}"
    capacity = next(line for line in card.lines if line.topic == "capacity")
    if not capacity.facts["skip_layers"]:  # nothing skipped: FP8's users are the table's own column
        assert users.fp8 == f"{int(float(row['users fp8'])):,}"
    scales = next(r for r in card.rows if "scales" in r.quantity.lower())
    read = next(line for line in card.lines if line.topic == "scales").facts["checkpoints"]
    assert (scales.state == "not measured") == (read == 0) and "0 of 0" not in scales.fp8  # none read: not measured
    index = (root / "reports" / profile / "index.html").read_text(encoding="utf-8")
    assert card.headline in index.replace("&#39;", "'") and "seed 0" not in index
