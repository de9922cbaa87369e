"""A plan of the bundled speed capture's grid, and that capture split into block stores as
``kvstudy run-block`` writes them (one store per seed block, each on its own node)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvstudy import capture as capture_format
from kvstudy.bench.grid import cell_status, item_states
from kvstudy.context.sweep import ContextSweepSpec
from kvstudy.context.sweep import prepare as prepare_context
from kvstudy.distribute.block import BLOCK_RECORD, block_state
from kvstudy.distribute.plan import make_plan, read_plan
from kvstudy.io import read_json, write_json_atomic
from kvstudy.profiles import declared_parameters
from kvstudy.speed.runner import prepare_capture
from kvstudy.speed.spec import SweepSpec

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "captures" / "speed-cpu"
BUNDLED_CONTEXT = ROOT / "data" / "captures" / "context-cpu"


def write_profile(folder: Path, name: str, notebooks: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(
        yaml.safe_dump({"description": "test profile", "defaults": {}, "notebooks": notebooks}), encoding="utf-8"
    )
    return folder


def fake_node(name: str) -> dict[str, Any]:
    return {"node_id": name, "host": name, "gpu_uuids": [], "cpu_model": "test CPU", "machine": {}}


def _block_manifest(record: dict[str, Any], folder: Path) -> tuple[Any, list[str]]:
    """The block's capture folder and manifest as the experiment's runner makes them; (spec, cell ids)."""
    if record["experiment"] == "speed":
        spec = SweepSpec.from_dict(record["spec"])
        prepare_capture(spec, folder, how="split from a bundled capture")
        return spec, [c.id for c in spec.cells()]
    spec = ContextSweepSpec.from_dict(record["spec"])
    prepare_context(spec, folder, how="split from a bundled capture")
    return spec, [c.id for c in spec.cells()]


def _item_states(record: dict[str, Any], spec: Any, folder: Path) -> dict[str, str]:
    if record["experiment"] == "speed":
        return {c.id: cell_status(folder, c.id) for c in spec.cells()}
    return item_states(folder, [c.id for c in spec.cells()])


def split_into_stores(capture: Path, plan_dir: Path, root: Path, nodes: list[str]) -> list[Path]:
    """One store per block of the plan: the capture's files of that block's server starts (and its
    node files), a manifest as the runner writes it for the block's spec, and ``block.json`` as
    run-block writes it."""
    plan_id, records = read_plan(plan_dir)
    stores = []
    for record, node in zip(records, nodes):
        store = root / f"store-{node}"
        folder = store / record["block_id"]
        spec, cells = _block_manifest(record, folder)
        runs = record["server_starts"]
        for path in sorted(p for p in capture.rglob("*") if p.is_file()):
            rel = path.relative_to(capture)
            mine = any(path.name.startswith(f"{rid}__") or path.name.startswith(f"{rid}.") for rid in runs)
            # every block keeps the served model's config.json (run-block copies it from the model
            # folder, which a fresh clone lacks: the bundled capture's copy stands in for it)
            if mine or rel.as_posix() in ("bandwidth.json", capture_format.MODEL_CONFIG):
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / rel)
        manifest = capture_format.read_manifest(folder)
        session = read_json(capture / "manifest.json")["sessions"][0]
        manifest["sessions"] = [{**session, "items_to_run": cells}]
        capture_format.set_items(manifest, _item_states(record, spec, folder))
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


@pytest.fixture()
def split() -> Any:
    """``split_into_stores`` (tests cannot import conftest under --import-mode=importlib)."""
    return split_into_stores


@pytest.fixture()
def profile_writer() -> Any:
    """``write_profile``."""
    return write_profile


@pytest.fixture()
def context_plan(tmp_path: Path) -> Path:
    """A plan of a profile whose 05 section is the bundled context capture's grid."""
    grid = read_json(BUNDLED_CONTEXT / "manifest.json")["spec"]
    declared = declared_parameters(ROOT / "notebooks" / "05_context-scaling.ipynb")
    params = {k: v for k, v in grid.items() if k in declared}
    profiles = write_profile(
        tmp_path / "cprofiles",
        "ctx",
        {"05_context-scaling": {"capture": str(BUNDLED_CONTEXT), "run_missing": False, **params}},
    )
    make_plan("ctx", tmp_path / "cplan", root=ROOT, profiles_dir=profiles)
    return tmp_path / "cplan"
