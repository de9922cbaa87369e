"""``kvstudy collect``: the blocks of one plan merged into the one capture format the notebooks read.

Every file of each block is copied but its manifest and ``block.json``; a file two blocks hold must
be byte-identical, except the node facts of ``NODE_FILES``, kept per block under ``nodes/<block-id>/``.
Each node's monotonic clock has its own origin, so the blocks are laid end to end in plan order
(``timeline_offset_s``) for the seed-blocked design check. Blocks of two plans, a block run twice, a
missing or unfinished one (unless ``partial``), blocks of other inputs, and an output folder that is
not a collect of this plan are refused in one line, nothing written.
"""

from __future__ import annotations

import fcntl
import filecmp
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvstudy import capture as capture_format
from kvstudy.bench.spec import RUN_ORDERS
from kvstudy.distribute.block import BLOCK_RECORD, manifest_items, store_blocks
from kvstudy.distribute.plan import experiment
from kvstudy.errors import StudyError
from kvstudy.io import is_finite_number, read_json

NODE_FILES = ("bandwidth.json",)  # facts of the node a block ran on, not of the experiment
NODES_DIR = "nodes"
SKIPPED = (capture_format.MANIFEST, BLOCK_RECORD)


def _found_blocks(stores: list[Path]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Each block id -> (its folder, its record). A store named twice (``store store/``, a link to it)
    is refused as that, before its blocks could look like a block run twice."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    named: dict[Path, Path] = {}
    for store in stores:
        if store.resolve() in named:
            raise StudyError(
                f"{store}: named twice among the stores (as {str(named[store.resolve()])!r} and {str(store)!r}): "
                "name each store once"
            )
        named[store.resolve()] = store
        blocks = store_blocks(store)
        if not blocks:
            raise StudyError(f"{store}: no block folders (a folder with {BLOCK_RECORD}) in this store")
        for folder, record in blocks:
            bid, first = record["block_id"], next(iter(found.values()), (folder, record))[1]
            if record["plan_id"] != first["plan_id"]:
                raise StudyError(
                    f"block {bid} ({folder}): belongs to plan {record['plan_id']}, block {first['block_id']} to plan "
                    f"{first['plan_id']}: blocks of two plans (collect each plan on its own)"
                )
            if bid in found:
                other_folder, other = found[bid]
                a, b = (other.get("node") or {}).get("node_id"), (record.get("node") or {}).get("node_id")
                where = f"on node {a!r} and on node {b!r}" if a != b else f"twice on node {a!r}"
                raise StudyError(
                    f"block {bid}: ran {where} ({other_folder}, {folder}): keep one of them, a block "
                    "must come from one node"
                )
            found[bid] = (folder, record)
    return found


def _check_status(folder: Path, record: dict[str, Any], items: dict[str, str]) -> None:
    """A block's ``block.json`` status agrees with its capture's manifest: ``ok`` only when every cell
    is ok, ``failed`` only when every cell has a result (a block killed mid-run says running)."""
    status = record["status"]
    allowed = ("ok",) if status == "ok" else ("ok", "failed")
    pending = sorted((k, v) for k, v in items.items() if v not in allowed)
    if pending or not items:
        cell, state = pending[0] if pending else ("(none)", "no cells")
        raise StudyError(
            f"{folder / BLOCK_RECORD}: status {status!r}, but its {capture_format.MANIFEST} says cell {cell} is "
            f"{state!r}: the block did not finish (run `kvstudy run-block` for it again)"
        )


def _check_out(out: Path, plan_id: str, exp: str) -> bool:
    """Whether ``out`` is an earlier collect of this plan (replaced); refuse anything else that exists.
    A collect killed between moving the earlier capture aside and putting the new one in place left
    only ``.OUT.replaced``: it is put back first, so this one sees (and replaces) it."""
    old = out.parent / f".{out.name}.replaced"
    if not out.exists() and not out.is_symlink() and old.is_dir() and not old.is_symlink():
        old.rename(out)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    manifest_path = out / capture_format.MANIFEST
    data = read_json(manifest_path) if manifest_path.is_file() else {}
    collected = (data.get("collected") or {}) if isinstance(data, dict) else {}
    if collected.get("plan_id") == plan_id and collected.get("experiment") == exp:
        return True
    raise StudyError(
        f"{out}: exists and is not a collected {exp} capture of plan {plan_id}; "
        "name a new --out folder (nothing overwritten)"
    )


def _copy_block(block_id: str, folder: Path, target: Path, first_of: dict[str, str]) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(folder)
        if len(rel.parts) == 1 and rel.name in SKIPPED:
            continue
        if rel.as_posix() in NODE_FILES:
            keep = target / NODES_DIR / block_id / rel
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, keep)
        dest = target / rel
        if dest.exists():
            if rel.as_posix() in NODE_FILES or filecmp.cmp(path, dest, shallow=False):
                continue
            raise StudyError(
                f"block {block_id}: {rel} differs from block {first_of[rel.as_posix()]}'s copy "
                "(blocks of one plan must agree on shared files; nothing written)"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        first_of[rel.as_posix()] = block_id


def _block_span(folder: Path) -> tuple[float, float] | None:
    """First start and last end of a block's cells on its node's monotonic clock (None if not recorded)."""
    starts, ends = [], []
    for path in (folder / "cells").glob("*.json"):
        data = read_json(path)  # a cell may hold NaN metrics (bench/grid.py writes them)
        if isinstance(data, dict) and is_finite_number(data.get("started_mono_s")):
            starts.append(float(data["started_mono_s"]))
            end: Any = data.get("ended_mono_s")
            ends.append(float(end) if is_finite_number(end) else starts[-1])
    return (min(starts), max(ends)) if starts else None


def collect(
    stores: list[str | Path], out: str | Path, experiment_name: str | None = None, partial: bool = False, how: str = ""
) -> dict[str, Any]:
    """Merge the block captures of ``stores`` into ``out``; returns the written manifest."""
    out = Path(out)
    found = _found_blocks([Path(s) for s in stores])
    any_record = next(iter(found.values()))[1]
    plan_id, plan_blocks = any_record["plan_id"], list(any_record["plan_blocks"])
    names = list(dict.fromkeys(str(b["experiment"]) for b in plan_blocks))
    if experiment_name is None and len(names) > 1:
        raise StudyError(f"plan {plan_id}: holds blocks of {', '.join(names)}: name one with --experiment")
    name = names[0] if experiment_name is None else experiment_name
    if name not in names:
        raise StudyError(f"--experiment {name!r}: plan {plan_id} has blocks of {', '.join(names)} only")
    wanted = [b for b in plan_blocks if b["experiment"] == name]
    missing, present = [], []
    for b in wanted:
        state = found.get(b["block_id"], (None, {}))[1].get("status")
        if state in ("ok", "failed"):
            present.append(b)
            continue
        why = "missing from the stores" if state is None else f"unfinished (status {state!r})"
        if not partial:
            raise StudyError(
                f"block {b['block_id']} (index {b['index']}): {why}; run `kvstudy run-block PLAN --index "
                f"{b['index']} --store STORE`, or collect with --partial"
            )
        missing.append({**b, "why": why})
    if not present:
        raise StudyError(f"plan {plan_id}: no finished {name} block in the stores")
    exp = experiment(name, f"plan {plan_id}")
    replace = _check_out(out, plan_id, name)
    manifests = {b["block_id"]: capture_format.read_manifest(found[b["block_id"]][0], exp.kind) for b in present}
    first = manifests[present[0]["block_id"]]
    full_dict = found[present[0]["block_id"]][1]["record"]["experiment_spec"]
    full = exp.spec_type.from_dict(full_dict, f"plan {plan_id}: experiment spec")
    manifest = capture_format.new_manifest(exp.kind, full_dict, how or "kvstudy collect", first.get("inputs"))
    manifest["machine"], manifest["versions"] = first.get("machine"), first.get("versions")
    sessions: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    merged: dict[str, Any] = {}
    end: float | None = None
    for b in present:
        bid = b["block_id"]
        folder, record = found[bid]
        items = manifest_items(folder, manifests[bid])
        _check_status(folder, record, items)
        if record["record"]["experiment_spec"] != full_dict:
            raise StudyError(f"block {bid}: its record holds another experiment spec than the plan's")
        if (manifests[bid].get("inputs") or {}).get("model_digest") != (first.get("inputs") or {}).get("model_digest"):
            raise StudyError(f"block {bid}: made from another model than block {present[0]['block_id']}")
        node = record.get("node") or {}
        merged.update(items)
        for s in manifests[bid].get("sessions") or []:
            sessions.append({**s, "block_id": bid, "node_id": node.get("node_id")})
        span = _block_span(folder)
        offset = None
        if span is not None:
            offset = 0.0 if end is None else end + 1.0 - span[0]
            end = span[1] + offset
        blocks.append(
            {
                "index": b["index"],
                "block_id": bid,
                "seeds": [b["seed"]],
                "status": record.get("status"),
                **{key: node.get(key) for key in ("node_id", "host", "gpu_uuids", "cpu_model")},
                "items": sorted(items),
                "timeline_offset_s": offset,
                "same_order_as_one_machine": record["record"].get("same_order_as_one_machine"),
            }
        )
    manifest["sessions"] = sessions
    capture_format.set_items(manifest, {c.id: str(merged.get(c.id, "missing")) for c in full.cells()})
    if exp.name == "speed":
        manifest["run_order"] = {
            "rule": full.run_order,
            "meaning": RUN_ORDERS[full.run_order],
            "server_starts": exp.server_starts(full),
            "executed": "each seed block on one node in this order; blocks possibly in parallel (see blocks)",
        }
    manifest["blocks"] = blocks
    manifest["collected"] = {
        "plan_id": plan_id,
        "experiment": exp.name,
        "collected_utc": capture_format.now_utc(),
        "partial": bool(missing),
        "missing_blocks": missing,
        "nodes": sorted({str(b["node_id"]) for b in blocks}),
        "blocking": "each block is one seed on one node: the seed-blocked analysis blocks on the node too",
        "node_files": f"{', '.join(NODE_FILES)}: the first block's at the top, each block's under {NODES_DIR}/",
    }
    with _staging(out) as (stage, old):
        first_of: dict[str, str] = {}
        for b in present:
            _copy_block(b["block_id"], found[b["block_id"]][0], stage, first_of)
        capture_format.write_manifest(stage, manifest)
        if replace:
            out.rename(old)
        elif out.exists():
            out.rmdir()
        stage.rename(out)
    return manifest


@contextmanager
def _staging(out: Path) -> Iterator[tuple[Path, Path]]:
    """(staging folder, where the replaced capture goes) beside ``out``, under a lock. Their names
    are fixed, so what a collect killed with SIGKILL left there is removed by the next one (a
    running collect into the same folder holds the lock: the second is refused)."""
    stage, old = out.parent / f".{out.name}.collect", out.parent / f".{out.name}.replaced"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.collect.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StudyError(f"{out}: another kvstudy collect is writing it now (wait for it)") from None
        for leftover in (stage, old):
            if leftover.is_symlink() or leftover.is_file():
                leftover.unlink()
            shutil.rmtree(leftover, ignore_errors=True)
        stage.mkdir()
        try:
            yield stage, old
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            if out.is_dir():  # else ``old`` is the only copy (a failure between the two renames)
                shutil.rmtree(old, ignore_errors=True)
            Path(lock.name).unlink(missing_ok=True)


def blocks_frame(manifest: dict[str, Any]) -> Any:
    """Which node ran which seed block of a collected capture (an empty frame for a one-machine capture)."""
    import pandas as pd

    rows = [
        {
            "block": b.get("block_id"),
            "seeds": ", ".join(str(s) for s in b.get("seeds") or []),
            "node": b.get("node_id"),
            "CPU": b.get("cpu_model"),
            "status": b.get("status"),
            "cells": len(b.get("items") or []),
        }
        for b in manifest.get("blocks") or []
    ]
    return pd.DataFrame(rows)
