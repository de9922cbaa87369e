"""Valid hand-written profiles a user really writes render notebook 01 from the bundled data (issue 35
item 9): optional parameters given as null (`context_len: ~`, `fixed_pool_tokens: ~`) and a GPU that
is not in the catalog (`gpu: null` with `gpu_memory_gib: 80`); a quoted number is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.report import render

ROOT = Path(__file__).resolve().parents[2]
STEM = "01_capacity-math"


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    """A copy of the repository's layout (notebooks and bundled data linked) with its own profiles."""
    for name in ("notebooks", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "profiles").mkdir()
    return tmp_path


def test_null_optionals_and_an_uncatalogued_gpu_render(study: Path) -> None:
    (study / "profiles" / "mine.yaml").write_text(
        "description: hand-written\nnotebooks:\n"
        f"  {STEM}:\n    context_len: ~\n    fixed_pool_tokens: ~\n    gpu: null\n    gpu_memory_gib: 80\n"
    )
    runs = render.run_profile("mine", root=study)
    assert [r.error for r in runs] == [None]
    html = (study / "reports" / "mine" / f"{STEM}.html").read_text(encoding="utf-8")
    # the request length vLLM would default to, labelled where it came from
    assert "max_position_embeddings, from which vLLM derives its default --max-model-len" in html
    assert "40,960" in html  # Qwen3-8B's max_position_embeddings
    status = json.loads((study / "reports" / "mine" / "status.json").read_text())
    assert status[STEM]["error"] is None and status[STEM]["verdicts"]


def test_a_quoted_number_is_one_clear_line(study: Path) -> None:
    (study / "profiles" / "quoted.yaml").write_text(f'notebooks:\n  {STEM}:\n    context_len: "8192"\n')
    with pytest.raises(StudyError) as info:
        render.run_profile("quoted", root=study)
    text = str(info.value)
    assert "\n" not in text and "quoted.yaml" in text
    assert "parameter 'context_len': expected a valid integer, got '8192'" in text
