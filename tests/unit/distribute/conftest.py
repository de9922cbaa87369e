"""A plan of the bundled speed capture's grid, and that capture split into block stores as
``kvstudy run-block`` writes them (one store per seed block, each on its own node)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvstudy import capture as capture_format
from kvstudy.distribute.block import BLOCK_RECORD, block_state
from kvstudy.distribute.plan import make_plan, read_plan
from kvstudy.io import read_json, write_json_atomic
from kvstudy.speed.runner import cell_status, prepare_capture
from kvstudy.speed.spec import SweepSpec

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "captures" / "speed-cpu"


def write_profile(folder: Path, name: str, notebooks: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(
        yaml.safe_dump({"description": "test profile", "defaults": {}, "notebooks": notebooks}), encoding="utf-8"
    )
    return folder


def fake_node(name: str) -> dict[str, Any]:
    return {"node_id": name, "host": name, "gpu_uuids": [], "cpu_model": "test CPU", "machine": {}}


def split_into_stores(capture: Path, plan_dir: Path, root: Path, nodes: list[str]) -> list[Path]:
    """One store per block of the plan: the capture's files of that block's server starts, a manifest
    as the runner writes it for the block's spec, and ``block.json`` as run-block writes it."""
    plan_id, records = read_plan(plan_dir)
    stores = []
    for record, node in zip(records, nodes):
        spec = SweepSpec.from_dict(record["spec"])
        store = root / f"store-{node}"
        folder = store / record["block_id"]
        prepare_capture(spec, folder, how="split from the bundled capture")
        runs = [r.id for r in spec.runs()]
        for path in sorted(p for p in capture.rglob("*") if p.is_file()):
            rel = path.relative_to(capture)
            if any(path.name.startswith(f"{rid}__") or path.name.startswith(f"{rid}.") for rid in runs):
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / rel)
        manifest = capture_format.read_manifest(folder)
        session = read_json(capture / "manifest.json")["sessions"][0]
        manifest["sessions"] = [{**session, "items_to_run": [c.id for c in spec.cells()]}]
        capture_format.set_items(manifest, {c.id: cell_status(folder, c) for c in spec.cells()})
        capture_format.write_manifest(folder, manifest)
        state = block_state(plan_id, records, record, fake_node(node), [{"started_utc": "split"}])
        state["status"] = "ok" if manifest["complete"] else "failed"
        write_json_atomic(folder / BLOCK_RECORD, state, indent=1)
        stores.append(store)
    return stores


@pytest.fixture()
def bundled_plan(tmp_path: Path) -> Path:
    """A plan of a profile whose 02 section is the bundled speed capture's grid (spec.json)."""
    grid = read_json(BUNDLED / "spec.json")
    profiles = write_profile(
        tmp_path / "profiles", "split", {"02_speed-sweep": {"capture": str(BUNDLED), "run_missing": False, **grid}}
    )
    make_plan("split", tmp_path / "plan", root=ROOT, profiles_dir=profiles)
    return tmp_path / "plan"
