"""``kvstudy run-block``: one pair-block of a plan into ``STORE/<block-id>/``, run with the
experiment's own runner restricted to the block's seed, beside ``block.json`` (plan, record, node,
attempts). A block belongs to one node: once any cell has a result, another node is refused, so a
comparison is never split across machines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstudy import capture as capture_format
from kvstudy.distribute.node import node_identity
from kvstudy.distribute.plan import ENGINE_PACKAGES, block_at, check_block_id, experiment, plan_index
from kvstudy.errors import StudyError
from kvstudy.io import get_field, read_json, write_json_atomic
from kvstudy.machine import package_versions
from kvstudy.model.folder import require_live
from kvstudy.progress import Progress

BLOCK_RECORD = capture_format.BLOCK_RECORD
BLOCK_STATES = ("running", "ok", "failed")


def read_block_record(folder: Path) -> dict[str, Any] | None:
    """A block folder's ``block.json``, typed (None when there is none): one line naming the file
    and the field for anything a command would trip on (a list for an object, NaN, a huge number,
    deep nesting, a number for a name, a block id that is no folder name)."""
    path = folder / BLOCK_RECORD
    if not path.is_file():
        return None
    data = read_json(path, finite=True)
    where = str(path)
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a block record (a JSON object), got a {type(data).__name__}")
    for key, kind in (("plan_id", str), ("block_id", str), ("plan_blocks", list), ("record", dict), ("node", dict)):
        get_field(data, key, kind, where)
    check_block_id(data["block_id"], where)
    get_field(data, "record.experiment_spec", dict, where)
    get_field(data, "record.same_order_as_one_machine", bool, where, None)
    status = get_field(data, "status", str, where)
    if status not in BLOCK_STATES:
        raise StudyError(f"{path}: status {status[:40]!r}: expected one of {', '.join(BLOCK_STATES)}")
    get_field(data, "node.node_id", (str, type(None)), where, None)
    get_field(data, "attempts", list, where, [])
    for i, entry in enumerate(data["plan_blocks"]):
        at = f"{path}: plan_blocks[{i}]"
        if not isinstance(entry, dict):
            raise StudyError(f"{at}: expected an object with index, block_id, experiment and seed")
        for name, expected in (("index", int), ("block_id", str), ("experiment", str), ("seed", int)):
            get_field(entry, name, expected, at)
        check_block_id(entry["block_id"], at)
    return data


def store_blocks(store: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every block folder of a store (a folder with ``block.json``), with its record."""
    if not store.is_dir():
        return []
    folders = sorted(p for p in store.iterdir() if p.is_dir())
    return [(folder, record) for folder in folders if (record := read_block_record(folder)) is not None]


def _check_store(store: Path, plan_id: str) -> None:
    for folder, record in store_blocks(store):
        if record["plan_id"] != plan_id:
            raise StudyError(
                f"{folder / BLOCK_RECORD}: block {record['block_id']} belongs to plan {record['plan_id']}, "
                f"not this plan {plan_id}: one store per plan (use another --store)"
            )


def _check_engine(record: dict[str, Any]) -> None:
    planned = record.get("engine") or {}
    here = package_versions(ENGINE_PACKAGES)
    for name, version in planned.items():
        if name in here and here[name] != version:
            raise StudyError(
                f"block {record['block_id']}: planned with {name} {version}, this node has {name} {here[name]} "
                "(install the planned version, or plan again on this engine)"
            )


def _items_state(folder: Path) -> dict[str, str]:
    """The block's item states; none before its manifest."""
    if not (folder / capture_format.MANIFEST).is_file():
        return {}
    return manifest_items(folder, capture_format.read_manifest(folder))


def manifest_items(folder: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """A block capture's item states (cell id -> ok, failed, running, missing), typed."""
    where = str(folder / capture_format.MANIFEST)
    items = get_field(manifest, "items", dict, where, {})
    for key, value in items.items():
        if not isinstance(value, str):
            raise StudyError(f"{where}: items.{key}: expected a state (a string), got {type(value).__name__}")
    return dict(items)


def block_state(
    plan_id: str, records: list[dict[str, Any]], record: dict[str, Any], node: dict[str, Any], attempts: list
) -> dict[str, Any]:
    """What ``block.json`` holds: the plan (its id and blocks), this block's record, its node, attempts."""
    return {
        "plan_id": plan_id,
        "plan_blocks": plan_index(records),
        "block_id": record["block_id"],
        "index": record["index"],
        "record": record,
        "node": node,
        "status": "running",
        "attempts": attempts,
    }


def run_block(
    plan_dir: str | Path,
    index: int,
    store: str | Path,
    retry_failed: bool = False,
    progress: Progress = print,
    how: str = "",
) -> str:
    """Run block ``index`` of the plan into ``store``; returns its status (``ok`` or ``failed``)."""
    from kvstudy.context.sweep import run_context_sweep
    from kvstudy.load.runner import run_load
    from kvstudy.speed.runner import run_sweep

    plan_id, records, record = block_at(plan_dir, index)
    store = Path(store)
    _check_store(store, plan_id)
    folder = store / check_block_id(record["block_id"], f"{plan_dir}: block {index}")
    if folder.is_symlink():
        raise StudyError(
            f"{folder}: the block's folder is a symlink; refusing to run a block through it "
            "(a block's capture is a plain folder in its store)"
        )
    node = node_identity()
    old = read_block_record(folder)
    if old is not None:
        ran_on = (old.get("node") or {}).get("node_id")
        if old.get("status") == "ok":
            progress(f"block {record['block_id']}: done on {ran_on} already; nothing run")
            return "ok"
        # a block whose cells have no result (ok or failed) yet may move to another node
        if ran_on != node["node_id"] and {"ok", "failed"} & set(_items_state(folder).values()):
            raise StudyError(
                f"block {record['block_id']}: started on node {ran_on!r}, this is {node['node_id']!r}: a block "
                f"runs on one node (delete {folder} to run it here from the start)"
            )
        if not capture_format.needs_run(old.get("status"), retry_failed):  # failed: kept (ok returned above)
            progress(f"block {record['block_id']}: failed before, kept; run again with --retry-failed")
            return "failed"
    _check_engine(record)
    exp = experiment(record["experiment"], f"block {record['block_id']}")
    spec = exp.spec_from_dict(record["spec"], f"block {record['block_id']}: spec")
    require_live(spec.model)  # before the block is claimed for this node: a node without the engine claims nothing
    attempts = list((old or {}).get("attempts") or [])
    attempt: dict[str, Any] = {"started_utc": capture_format.now_utc(), "retry_failed": retry_failed}
    state = block_state(plan_id, records, record, node, [*attempts, attempt])
    capture_format.check_new_capture(folder)  # a folder of the user's files is refused before block.json
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / BLOCK_RECORD, state, indent=1)
    how = how or f"kvstudy run-block {plan_dir} --index {index} --store {store}"
    progress(f"block {record['block_id']} ({record['experiment']}, seed {record['seed']}) on {node['node_id']}")
    try:
        if record["experiment"] == "speed":
            run_sweep(spec, folder, how=how, progress=progress, retry_failed=retry_failed)
        elif record["experiment"] == "load":
            run_load(spec, folder, how=how, progress=progress, retry_failed=retry_failed)
        else:
            run_context_sweep(spec, folder, how=how, retry_failed=retry_failed, progress=progress)
    finally:
        items = _items_state(folder)
        done = bool(items) and all(v == "ok" for v in items.values())
        complete = bool(items) and all(v in ("ok", "failed") for v in items.values())
        state["status"] = "ok" if done else "failed" if complete else "running"
        attempt.update(finished_utc=capture_format.now_utc(), items=items)
        write_json_atomic(folder / BLOCK_RECORD, state, indent=1)
    return str(state["status"])
