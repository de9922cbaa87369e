"""Collecting block stores: the bundled speed capture split by seed block and collected gives the
same analysis; bad stores are refused with one line naming the block, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kvstudy import cli
from kvstudy.distribute.block import BLOCK_RECORD, run_block
from kvstudy.distribute.collect import blocks_frame, collect
from kvstudy.distribute.plan import make_plan, read_plan
from kvstudy.errors import StudyError
from kvstudy.io import read_json, write_json_atomic
from kvstudy.report.tables import SPEED_VERDICTS, render
from kvstudy.speed import analysis as speed
from kvstudy.speed import verdicts_table as vt

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "captures" / "speed-cpu"

NODES = ["node-a", "node-b", "node-c"]


def _analysis(capture: Path) -> dict[str, pd.DataFrame]:
    """What notebook 02 computes from a capture: the per-seed table, summary, verdicts, the A/B guard
    (the calibration's resampling is left out: it reads the same per-run values as the verdicts, slowly)."""
    cap = speed.load_capture(capture)
    order = [c.name for c in cap.spec.configurations]
    seeds = speed.seed_table(cap).sort_values(["users", "configuration", "seed"]).reset_index(drop=True)
    return {
        "seeds": seeds,
        "summary": speed.summary_table(seeds, order),
        "verdicts": render(vt.capture_verdicts(cap, 0.05, None), SPEED_VERDICTS),
        "server metrics": vt.server_metrics_frame(cap),
        "A/B guard": speed.ab_differences(cap, order[0], order[1]),
        "clock-adjusted": speed.clock_adjusted(seeds, order),
        "status": speed.cell_status_frame(cap),
    }


def test_split_by_seed_block_and_collected_gives_the_bundled_analysis(
    bundled_plan: Path, tmp_path: Path, split: Any
) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    out = tmp_path / "collected"
    manifest = collect(stores, out)
    bundled_manifest = read_json(BUNDLED / "manifest.json")
    assert manifest["kind"] == bundled_manifest["kind"]
    assert manifest["spec"] == speed.load_capture(BUNDLED).spec.to_dict()
    assert manifest["items"] == bundled_manifest["items"] and manifest["complete"]
    assert manifest["run_order"]["server_starts"] == bundled_manifest["run_order"]["server_starts"]
    for sub in ("cells", "requests", "bench", "telemetry", "runs"):
        for path in (BUNDLED / sub).iterdir():
            assert (out / sub / path.name).read_bytes() == path.read_bytes(), path.name
    mine, theirs = _analysis(out), _analysis(BUNDLED)
    for name, frame in theirs.items():
        pd.testing.assert_frame_equal(mine[name], frame, obj=name)
    assert "claim" in " ".join(mine["verdicts"]["verdict"])  # the verdicts were computed, not empty
    nodes = blocks_frame(manifest).set_index("seeds")["node"].to_dict()
    assert nodes == {"0": "node-a", "1": "node-b", "2": "node-c"}
    assert manifest["collected"]["partial"] is False and len(manifest["sessions"]) == 3


def _designs(capture: Path) -> set[str]:
    return {cv.verdict.order_design for cv in vt.capture_verdicts(speed.load_capture(capture))}


def test_blocks_on_one_timeline_keep_each_block_adjacent(bundled_plan: Path, tmp_path: Path, split: Any) -> None:
    """Blocks run at the same time on nodes whose clocks overlap are laid end to end in plan order,
    so the seed-blocked ABBA check still sees each block's runs adjacent (without it: split blocks)."""
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    folders = [next(p for p in store.iterdir() if p.is_dir()) for store in stores]
    start0 = min(read_json(p)["started_mono_s"] for p in (folders[0] / "cells").glob("*.json"))
    for folder in folders[1:]:  # every node started its block at the same instant as node a
        paths = sorted((folder / "cells").glob("*.json"))
        shift = min(read_json(p)["started_mono_s"] for p in paths) - start0 + 0.5
        for path in paths:
            cell = read_json(path)
            cell["started_mono_s"] -= shift
            cell["ended_mono_s"] -= shift
            write_json_atomic(path, cell, indent=1)
    out = tmp_path / "out"
    collect(stores, out)
    assert _designs(out) == {"blocked, balanced (ABBA)"}
    manifest = read_json(out / "manifest.json")
    del manifest["blocks"]  # the same cells read as one machine's clock: the blocks interleave in time
    write_json_atomic(out / "manifest.json", manifest, indent=1)
    assert "blocked, balanced (ABBA)" not in _designs(out)


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvstudy: error: ") and "\n" not in err
    return err


def test_missing_block_refused_unless_partial(bundled_plan: Path, tmp_path: Path, capsys, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    _, records = read_plan(bundled_plan)
    out = tmp_path / "out"
    err = _one_line_error(capsys, ["collect", str(stores[0]), str(stores[2]), "--out", str(out)])
    assert records[1]["block_id"] in err and "missing" in err and not out.exists()
    manifest = collect([stores[0], stores[2]], out, partial=True)
    assert manifest["collected"]["partial"] and manifest["collected"]["missing_blocks"][0]["index"] == 1
    assert manifest["items"]["auto__s1__u1"] == "missing" and not manifest["complete"]


def test_block_run_twice_on_two_nodes_refused(bundled_plan: Path, tmp_path: Path, capsys, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    again = split(BUNDLED, bundled_plan, tmp_path / "again", ["node-x", "node-y", "node-z"])
    err = _one_line_error(capsys, ["collect", *map(str, stores), str(again[0]), "--out", str(tmp_path / "out")])
    assert "node-a" in err and "node-x" in err and "ran on node" in err
    assert not (tmp_path / "out").exists()


def test_blocks_of_two_plans_refused(
    bundled_plan: Path, tmp_path: Path, capsys, split: Any, profile_writer: Any
) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    grid = {**read_json(BUNDLED / "spec.json"), "output_len": 95}
    profiles = profile_writer(tmp_path / "p2", "other", {"02_speed-sweep": {"run_missing": False, **grid}})
    make_plan("other", tmp_path / "plan2", root=ROOT, profiles_dir=profiles)
    other_plan, _ = read_plan(tmp_path / "plan2")
    record = read_json(next(stores[2].glob(f"*/{BLOCK_RECORD}")))
    record["plan_id"] = other_plan
    write_json_atomic(next(stores[2].glob(f"*/{BLOCK_RECORD}")), record, indent=1)
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(tmp_path / "out")])
    assert "two plans" in err and other_plan in err and record["block_id"] in err
    # run-block refuses to add a block of this plan to a store holding another plan's block
    with pytest.raises(StudyError, match="one store per plan"):
        run_block(bundled_plan, 0, stores[2])


def test_out_folder_that_is_not_this_plans_capture_is_kept(
    bundled_plan: Path, tmp_path: Path, capsys, split: Any
) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(out)])
    assert "not a collected speed capture" in err and (out / "notes.txt").read_text() == "mine"
    shutil.rmtree(out)
    collect(stores, out)
    collect(stores, out)  # an earlier collect of the same plan is replaced
    assert read_json(out / "manifest.json")["collected"]["plan_id"] == read_plan(bundled_plan)[0]


def test_shared_file_that_differs_is_refused(bundled_plan: Path, tmp_path: Path, capsys, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    config = next(stores[1].glob("*/model/config.json"))
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 7}))
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(tmp_path / "out")])
    assert "model/config.json differs" in err and not (tmp_path / "out").exists()


def test_node_files_are_kept_per_block(bundled_plan: Path, tmp_path: Path, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    for i, store in enumerate(stores):
        write_json_atomic(next(p for p in store.iterdir() if p.is_dir()) / "bandwidth.json", {"best_gb_s": 10 + i})
    manifest = collect(stores, tmp_path / "out")
    assert read_json(tmp_path / "out" / "bandwidth.json")["best_gb_s"] == 10
    kept = sorted(read_json(p)["best_gb_s"] for p in (tmp_path / "out" / "nodes").glob("*/bandwidth.json"))
    assert kept == [10, 11, 12] and "bandwidth.json" in manifest["collected"]["node_files"]


def test_run_block_index_past_the_plan(bundled_plan: Path, tmp_path: Path, capsys) -> None:
    err = _one_line_error(capsys, ["run-block", str(bundled_plan), "--index", "3", "--store", str(tmp_path / "s")])
    assert "block index 3: the plan has 3 blocks (0..2)" in err and not (tmp_path / "s").exists()


def test_run_block_refuses_a_block_started_on_another_node(bundled_plan: Path, tmp_path: Path, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    path = next(stores[0].glob(f"*/{BLOCK_RECORD}"))
    record = read_json(path)
    record["status"] = "running"
    write_json_atomic(path, record, indent=1)
    before = path.read_bytes()
    with pytest.raises(StudyError, match="started on node 'node-a'.*runs on one node"):
        run_block(bundled_plan, 0, stores[0])
    assert path.read_bytes() == before


def test_run_block_of_a_done_block_runs_nothing(bundled_plan: Path, tmp_path: Path, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    lines: list[str] = []
    assert run_block(bundled_plan, 1, stores[1], progress=lines.append) == "ok"
    assert "nothing run" in lines[0]


def test_hand_edited_plan_record_is_refused(bundled_plan: Path) -> None:
    path = bundled_plan / "plan.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["spec"]["output_len"] = 1
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(StudyError, match="line 2: block .* does not match its record_hash"):
        read_plan(bundled_plan)


def test_context_blocks_collected_give_the_bundled_fits(context_plan: Path, tmp_path: Path, split: Any) -> None:
    """The context sweep too: split by seed block, collected, the same fits, slopes and comparisons."""
    from kvstudy.context import sweep

    bundled = ROOT / "data" / "captures" / "context-cpu"
    _, records = read_plan(context_plan)
    assert [r["experiment"] for r in records] == ["context"] * 3
    assert all(r["same_order_as_one_machine"] for r in records)  # two arms: the length order is kept
    stores = split(bundled, context_plan, tmp_path, NODES)
    out = tmp_path / "collected"
    manifest = collect(stores, out)
    assert manifest["items"] == read_json(bundled / "manifest.json")["items"] and manifest["complete"]
    mine, theirs = sweep.analyse_capture(out, n_boot=200), sweep.analyse_capture(bundled, n_boot=200)
    assert mine.fits and mine.fits == theirs.fits and mine.comparisons == theirs.comparisons
    assert mine.bandwidth == theirs.bandwidth and len(list((out / "nodes").glob("*/bandwidth.json"))) == 3


def test_a_block_claimed_without_results_may_move(
    bundled_plan: Path, tmp_path: Path, split: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that claimed a block and measured nothing (no engine, preempted before a cell) does
    not lock it: another node gets past the node check, to the engine check, before claiming it."""
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    folder = next(p for p in stores[0].iterdir() if p.is_dir())
    for sub in ("cells", "requests", "bench", "telemetry", "runs"):
        shutil.rmtree(folder / sub)
    manifest = read_json(folder / "manifest.json")
    manifest["items"] = dict.fromkeys(manifest["items"], "missing")
    write_json_atomic(folder / "manifest.json", manifest, indent=1)
    record = read_json(folder / BLOCK_RECORD)
    record["status"] = "running"
    write_json_atomic(folder / BLOCK_RECORD, record, indent=1)

    def engine_check(model: str) -> None:
        raise StudyError(f"engine check reached for {model}")

    monkeypatch.setattr("kvstudy.distribute.block.require_live", engine_check)
    with pytest.raises(StudyError, match="engine check reached"):
        run_block(bundled_plan, 0, stores[0])
    assert read_json(folder / BLOCK_RECORD)["node"]["node_id"] == "node-a"  # not claimed before the check


def test_a_store_named_twice_is_refused_as_named_twice(bundled_plan: Path, tmp_path: Path, capsys, split: Any) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    again = str(stores[1]) + "/"
    err = _one_line_error(capsys, ["collect", *map(str, stores), again, "--out", str(tmp_path / "out")])
    assert "named twice among the stores" in err and "ran" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("status", ["ok", "failed"])
def test_a_block_that_says_done_while_its_manifest_says_running_is_refused(
    bundled_plan: Path, tmp_path: Path, capsys, split: Any, status: str
) -> None:
    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    folder = next(p for p in stores[2].iterdir() if p.is_dir())
    record = read_json(folder / BLOCK_RECORD)
    record["status"] = status
    write_json_atomic(folder / BLOCK_RECORD, record, indent=1)
    manifest = read_json(folder / "manifest.json")
    cell = sorted(manifest["items"])[0]
    manifest["items"][cell] = "running"
    write_json_atomic(folder / "manifest.json", manifest, indent=1)
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(tmp_path / "out")])
    assert f"{folder / BLOCK_RECORD}: status {status!r}" in err and f"cell {cell} is 'running'" in err
    assert not (tmp_path / "out").exists()


def test_collect_killed_mid_write_does_not_block_the_rerun(bundled_plan: Path, tmp_path: Path, split: Any) -> None:
    """A collect SIGKILLed while writing (here: as it writes the manifest, once into a new folder and
    once replacing an earlier collect) leaves its staging folder; the next collect removes it and
    finishes, and no hidden leftover stays beside the capture."""
    import os
    import signal
    import subprocess
    import sys

    stores = split(BUNDLED, bundled_plan, tmp_path, NODES)
    out = tmp_path / "outs" / "collected"
    script = (
        "import os, signal, sys\n"
        "from kvstudy import capture\n"
        "from kvstudy.distribute.collect import collect\n"
        "capture.write_manifest = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "collect(sys.argv[2:], sys.argv[1])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for round_ in range(2):
        done = subprocess.run([sys.executable, "-c", script, str(out), *map(str, stores)], env=env, timeout=300)
        assert done.returncode == -signal.SIGKILL
        assert (out.parent / ".collected.collect").is_dir()  # what the killed collect left
        manifest = collect(stores, out)
        assert manifest["complete"] and read_json(out / "manifest.json")["collected"]["plan_id"]
        leftovers = sorted(p.name for p in out.parent.iterdir() if p.name != "collected")
        assert leftovers == [], (round_, leftovers)
