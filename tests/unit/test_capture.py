"""kvstudy.capture: manifests are redacted on write, a capture knows its inputs, retries keep old
logs, and committed data carries no build-machine absolute path (issue 10)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvstudy import capture, cli
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]
# folders colleagues are re-making live right now: relativized once their runs finish
BEING_REMADE: tuple[str, ...] = ()


def _model(folder: Path, hidden: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    return folder


def test_write_manifest_redacts_every_secret(tmp_path: Path) -> None:
    manifest = capture.new_manifest(
        "k",
        {
            "server_env": {"HF_TOKEN": "plantedTok123", "N": "1"},
            "extra_args": ["--api-key", "plantedKey456"],
            "url": "postgres://admin:plantedPw789@db/x",
        },
        "test",
    )
    capture.start_session(manifest, ["a"])
    capture.write_manifest(tmp_path, manifest)
    text = (tmp_path / capture.MANIFEST).read_text()
    assert all(s not in text for s in ("plantedTok123", "plantedKey456", "plantedPw789"))
    back = capture.read_manifest(tmp_path)
    assert back["spec"]["server_env"]["N"] == "1" and back["sessions"][0]["items_to_run"] == ["a"]


def test_check_inputs_refuses_another_model_naming_the_difference(tmp_path: Path) -> None:
    one, two = _model(tmp_path / "one"), _model(tmp_path / "two", hidden=16)
    manifest = {"inputs": capture.model_inputs(one)}
    capture.check_inputs(tmp_path, manifest, capture.model_inputs(one))
    with pytest.raises(StudyError, match="other inputs.*model_digest"):
        capture.check_inputs(tmp_path, manifest, capture.model_inputs(two))
    with pytest.raises(StudyError, match="other inputs.*model 'a/b'"):
        capture.check_inputs(tmp_path, {"inputs": {"model": "a/b"}}, capture.model_inputs("c/d"))
    capture.check_inputs(tmp_path, {"inputs": {}}, capture.model_inputs(two))  # older manifests


def test_keep_old_attempt_never_overwrites(tmp_path: Path) -> None:
    log = tmp_path / "x.server.log"
    assert capture.keep_old_attempt(log) is None
    for text in ("one", "two"):
        log.write_text(text)
        capture.keep_old_attempt(log)
    assert (tmp_path / "x.server.attempt1.log").read_text() == "one"
    assert (tmp_path / "x.server.attempt2.log").read_text() == "two" and not log.exists()


def test_relativize_folder_rewrites_text_and_keeps_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = "/build/machine/repo"
    (tmp_path / "a.json").write_text(json.dumps({"model": f"{root}/data/m", "cwd": root, "other": f"{root}2/x"}))
    (tmp_path / "b.log").write_text(f"loading {root}/data/m/config.json\n")
    (tmp_path / "c.bin").write_bytes(b"\x00\xff" + root.encode())
    changed = capture.relativize_folder(tmp_path, root)
    assert sorted(p.name for p in changed) == ["a.json", "b.log"]
    assert json.loads((tmp_path / "a.json").read_text()) == {"model": "data/m", "cwd": ".", "other": f"{root}2/x"}
    assert (tmp_path / "b.log").read_text() == "loading data/m/config.json\n"
    assert (tmp_path / "c.bin").read_bytes().endswith(root.encode())
    assert cli.main(["capture", "relativize", str(tmp_path)]) == 0
    assert "0 file(s)" in capsys.readouterr().out


def test_relativize_keeps_file_modes_and_refuses_a_folder_it_cannot_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30's second corpus: a 0755 script stayed 0600, and a folder it cannot list exited 0."""
    root = "/build/machine/repo"
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\ncd {root}/data\n")
    script.chmod(0o755)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.md").write_text(f"{root}/x\n")
    (tmp_path / "sub" / "notes.md").chmod(0o640)
    assert len(capture.relativize_folder(tmp_path, root)) == 2
    assert script.read_text() == "#!/bin/sh\ncd data\n" and (script.stat().st_mode & 0o777) == 0o755
    assert ((tmp_path / "sub" / "notes.md").stat().st_mode & 0o777) == 0o640
    real_scandir = os.scandir

    def scandir(path: object) -> object:  # root lists any folder: make one unlistable the way a user meets it
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    assert cli.main(["capture", "relativize", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sub: cannot be listed (Permission denied)" in err[0]


def test_no_committed_data_holds_the_repository_path() -> None:
    needle = str(ROOT).encode()
    offenders = []
    for path in sorted((ROOT / "data").rglob("*")):
        rel = path.relative_to(ROOT).as_posix()
        if not path.is_file() or any(rel == f or rel.startswith((f + "/", f + ".")) for f in BEING_REMADE):
            continue
        if needle in path.read_bytes():
            offenders.append(rel)
    assert offenders == [], f"run: kvstudy capture relativize on {offenders[:5]}"


def test_speed_sweep_refuses_a_capture_of_another_model(tmp_path: Path) -> None:
    from kvstudy.speed import runner as sweep

    model = _model(tmp_path / "m")
    spec = sweep.SweepSpec.from_dict(
        {
            "model": str(model),
            "configurations": [{"name": "auto"}],
            "seeds": [0],
            "users": [1],
            "cpu_kvcache_space_gib": 1.0,
        }
    )
    manifest = sweep.prepare_capture(spec, tmp_path / "cap")
    assert manifest["inputs"] == capture.model_inputs(model)
    sweep.prepare_capture(spec, tmp_path / "cap")  # same model: resumed
    (model / "config.json").write_text(json.dumps({"hidden_size": 16}))  # same path, other weights
    with pytest.raises(StudyError, match="other inputs.*model_digest"):
        sweep.prepare_capture(spec, tmp_path / "cap")


def test_resuming_an_older_capture_format_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Format 1 (``cells``, sessions with ``cells_to_run``) is no longer read: one line, nothing rewritten."""
    old = {"kind": "kvstudy context sweep", "spec": {"lengths": [64]}, "cells": {"a": "ok"}}
    (tmp_path / capture.MANIFEST).write_text(json.dumps(old))
    with pytest.raises(StudyError, match=r"manifest.json: format_version None is an older capture format; expected 2"):
        capture.create_or_resume(tmp_path, old["kind"], old["spec"], "test", {}, lambda g, w: g)
    assert json.loads((tmp_path / capture.MANIFEST).read_text()) == old


def test_relativize_moved_from_renames_a_capture_folder_in_its_records(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    folder = root / "data" / "captures" / "run"
    (folder / "cells").mkdir(parents=True)
    (folder / "cells" / "a.json").write_text(
        json.dumps(
            {
                "log": "data/captures/run.new/logs/a.log",
                "other": "data/captures/run.newer/x",
                "abs": f"{root}/data/captures/run.new",
            }
        )
    )
    (folder / capture.MANIFEST).write_text(json.dumps({"how": "kvstudy sweep spec.json data/captures/run.new"}))
    (folder / "SOURCE.md").write_text("made in data/captures/run.new\n")
    changed = capture.relativize_folder(folder, root, moved_from="data/captures/run.new")
    assert [p.name for p in changed] == ["a.json"]
    assert json.loads((folder / "cells" / "a.json").read_text()) == {
        "log": "data/captures/run/logs/a.log",
        "other": "data/captures/run.newer/x",
        "abs": "data/captures/run",
    }
    # the manifest and the Markdown page record how the capture was made: they keep the old name
    assert "run.new" in (folder / capture.MANIFEST).read_text() and "run.new" in (folder / "SOURCE.md").read_text()


def test_capture_keeps_the_served_models_config(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    cap = tmp_path / "cap"
    with pytest.raises(StudyError, match="model/config.json: not found"):
        capture.model_config(cap, tmp_path / "absent")
    capture.keep_model_config(cap, model)
    (model / "config.json").write_text('{"model_type": "changed later"}')
    capture.keep_model_config(cap, model)  # kept once: the capture holds what was served
    assert capture.model_config(cap, tmp_path / "absent") == cap / capture.MODEL_CONFIG
    assert json.loads((cap / capture.MODEL_CONFIG).read_text()) == {"model_type": "qwen3"}
    assert capture.model_config(tmp_path / "other", model) == model / "config.json"  # no copy: the folder's


def test_bundled_sweep_captures_hold_the_served_config_with_the_recorded_digest() -> None:
    from kvstudy.io import file_digest

    for name in ("speed-cpu", "context-cpu"):
        folder = ROOT / "data" / "captures" / name
        kept = folder / capture.MODEL_CONFIG
        records = [json.loads(p.read_text()) for p in sorted((folder / "runs").glob("*.json"))]
        digests = {r["record"]["model"]["config_sha256"] for r in records if r.get("record")}
        assert digests == {file_digest(kept)}, name


# --------------------------------------------------------------------------- a new capture's folder (issue 25)


def _users_folder(folder: Path) -> dict[str, bytes]:
    """A folder of the user's own files (what a capture must never be made among); its contents."""
    (folder / "thesis").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "thesis" / "draft.md").write_text("# draft\n")
    return _contents(folder)


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _speed_spec(model: Path) -> Any:
    from kvstudy.speed import runner as sweep

    return sweep.SweepSpec.from_dict(
        {
            "model": str(model),
            "configurations": [{"name": "auto"}],
            "seeds": [0],
            "users": [1],
            "cpu_kvcache_space_gib": 1.0,
        }
    )


def _context_spec(model: Path) -> Any:
    from kvstudy.context.sweep import ContextSweepSpec

    return ContextSweepSpec.from_dict(
        {
            "model": str(model),
            "arms": [{"name": "auto"}],
            "lengths": [256, 1024],
            "seeds": [0],
            "cpu_kvcache_space_gib": 1,
        }
    )


def test_speed_sweep_refuses_a_folder_of_the_users_files_and_changes_nothing(tmp_path: Path) -> None:
    from kvstudy.speed import runner as sweep

    folder = tmp_path / "mine"
    before = _users_folder(folder)
    with pytest.raises(StudyError, match=r"mine: not empty and holds no manifest.json .*use a new or empty folder"):
        sweep.prepare_capture(_speed_spec(_model(tmp_path / "m")), folder)
    assert _contents(folder) == before


def test_context_sweep_refuses_a_folder_of_the_users_files_and_changes_nothing(tmp_path: Path) -> None:
    from kvstudy.context import sweep

    folder = tmp_path / "mine"
    before = _users_folder(folder)
    with pytest.raises(StudyError, match=r"mine: not empty and holds no manifest.json .*use a new or empty folder"):
        sweep.prepare(_context_spec(_model(tmp_path / "m")), folder, "test")
    assert _contents(folder) == before


def test_accuracy_runs_refuse_a_folder_of_the_users_files_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstudy.accuracy import runner as ge

    folder = tmp_path / "mine"
    before = _users_folder(folder)
    monkeypatch.setattr(ge, "require_live", lambda *a, **k: None)
    monkeypatch.setattr(ge, "run_group", lambda *a, **k: pytest.fail("started a server"))
    with pytest.raises(StudyError, match=r"mine: not empty and holds no manifest.json .*use a new or empty folder"):
        ge.run_missing(["bf16"], _model(tmp_path / "m"), folder, ge.EvalSettings(n=2), progress=lambda line: None)
    assert _contents(folder) == before


def test_an_empty_folder_becomes_a_capture_and_a_capture_resumes(tmp_path: Path) -> None:
    from kvstudy.accuracy import runner as ge
    from kvstudy.context import sweep as context
    from kvstudy.speed import runner as sweep
    from kvstudy.vllm.command import ServerConfig

    model = _model(tmp_path / "m")
    for name in ("speed", "context", "accuracy"):
        (tmp_path / name).mkdir()
    for _ in range(2):  # made, then resumed
        sweep.prepare_capture(_speed_spec(model), tmp_path / "speed")
        context.prepare(_context_spec(model), tmp_path / "context", "test")
        ge.write_manifest(tmp_path / "accuracy", ["bf16"], model, ge.EvalSettings(n=2), ServerConfig(model=str(model)))
    assert len(capture.read_manifest(tmp_path / "accuracy")["sessions"]) == 2
    assert capture.read_manifest(tmp_path / "speed")["inputs"] == capture.model_inputs(model)
    assert (tmp_path / "context" / capture.MANIFEST).is_file()


def test_what_the_project_writes_before_the_manifest_is_not_the_users(tmp_path: Path) -> None:
    from kvstudy.outputs import GENERATED_MARKER

    block = tmp_path / "block"
    block.mkdir()
    (block / capture.BLOCK_RECORD).write_text("{}")  # run-block's record, written before the runner starts
    (block / ".manifest.json.abc123.tmp").write_text("")  # an interrupted atomic write of the manifest
    assert capture.check_new_capture(block) == block
    claimed = tmp_path / "claimed"  # a folder a generator claimed (kv-simulate --force): outputs checked it
    claimed.mkdir()
    (claimed / GENERATED_MARKER).write_text(json.dumps({"generator": "kv-simulate"}))
    (claimed / "old.txt").write_text("kept with --force\n")
    assert capture.check_new_capture(claimed) == claimed
    (block / "notes.txt").write_text("mine\n")
    with pytest.raises(StudyError, match="found 'notes.txt'"):
        capture.check_new_capture(block)


def test_a_symlinked_capture_folder_or_a_planted_link_is_refused(tmp_path: Path) -> None:
    from kvstudy.speed import runner as sweep

    model, elsewhere = _model(tmp_path / "m"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StudyError, match=r"linked: is a symlink; refusing to make a capture through it"):
        sweep.prepare_capture(_speed_spec(model), tmp_path / "linked")
    planted = tmp_path / "planted"
    (planted / "model").mkdir(parents=True)
    (planted / "model" / "config.json").symlink_to(elsewhere / "target.json")
    with pytest.raises(StudyError, match=r"config.json: is a symlink; refusing to write through it"):
        sweep.prepare_capture(_speed_spec(model), planted)
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in planted.rglob("*")) == ["config.json", "model"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StudyError, match="afile: exists and is not a folder"):
        sweep.prepare_capture(_speed_spec(model), tmp_path / "afile")
