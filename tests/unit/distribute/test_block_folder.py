"""``kvstudy run-block`` makes a block's capture only in a folder of its own: a block folder holding
the user's files is refused before ``block.json`` is written; a block claimed before its runner made
the manifest (only ``block.json`` there) still runs (issue 25)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvstudy import capture as capture_format
from kvstudy.distribute.block import BLOCK_RECORD, run_block
from kvstudy.distribute.plan import EXPERIMENTS, read_plan
from kvstudy.errors import StudyError
from kvstudy.speed import runner as speed_runner
from kvstudy.speed.spec import SweepSpec


def _block_folder(plan: Path, store: Path) -> Path:
    _, records = read_plan(plan)
    return store / records[0]["block_id"]


def test_run_block_refuses_a_block_folder_of_the_users_files(
    bundled_plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kvstudy.distribute.block.require_live", lambda model: None)
    monkeypatch.setitem(EXPERIMENTS, "speed", replace(EXPERIMENTS["speed"], run=lambda *a, **k: pytest.fail("ran")))
    folder = _block_folder(bundled_plan, tmp_path / "store")
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    with pytest.raises(StudyError, match=r"not empty and holds no manifest.json .*use a new or empty folder"):
        run_block(bundled_plan, 0, tmp_path / "store")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # no block.json: nothing claimed
    assert (folder / "notes.txt").read_text() == "mine\n"


def test_a_block_claimed_before_its_manifest_still_runs(
    bundled_plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Path] = []

    def prepare_only(spec: SweepSpec, capture: Path, **_: Any) -> list[Any]:
        assert (capture / BLOCK_RECORD).is_file()  # run-block's record is there before the manifest
        speed_runner.prepare_capture(spec, capture)  # the runner's real first write
        made.append(capture)
        return []

    monkeypatch.setattr("kvstudy.distribute.block.require_live", lambda model: None)
    monkeypatch.setitem(EXPERIMENTS, "speed", replace(EXPERIMENTS["speed"], run=prepare_only))
    for _ in range(2):  # a new block, then the same block again (block.json and its manifest there)
        assert run_block(bundled_plan, 0, tmp_path / "store", progress=lambda line: None) == "running"
    assert len(made) == 2 and (made[0] / capture_format.MANIFEST).is_file()
