"""The emitted Slurm, Kubernetes and SkyPilot files: parsed, syntax-checked, their fields read back."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvstudy.distribute.emit import emit
from kvstudy.distribute.plan import make_plan, read_plan
from kvstudy.errors import StudyError
from kvstudy.io import read_json

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "captures" / "speed-cpu"


def _gpu_plan(tmp_path: Path, tp: int, profile_writer: Any) -> Path:
    grid = {
        **read_json(BUNDLED / "spec.json"),
        "cpu_kvcache_space_gib": None,
        "server_extra_args": ["--tensor-parallel-size", str(tp)],
        "seeds": [0, 1, 2, 3],
    }
    profiles = profile_writer(
        tmp_path / "profiles",
        "gpu",
        {"02_speed-sweep": {"run_missing": False, **grid}, "01_capacity-math": {"gpu": "H100-SXM"}},
    )
    make_plan("gpu", tmp_path / "plan", root=ROOT, profiles_dir=profiles)
    return tmp_path / "plan"


def test_slurm_array_with_throttle_and_gres_from_tp(tmp_path: Path, profile_writer: Any) -> None:
    plan = _gpu_plan(tmp_path, 2, profile_writer)
    plan_id, records = read_plan(plan)
    assert [r["tensor_parallel_size"] for r in records] == [2] * 4
    (path,) = emit(["slurm"], plan, plan_id, records, "store", parallel=3)
    subprocess.run(["bash", "-n", str(path)], check=True)
    sbatch = [line.split(None, 1)[1] for line in path.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "--array=0-3%3" in sbatch and "--gres=gpu:2" in sbatch
    assert '--index "$SLURM_ARRAY_TASK_ID" --store store' in path.read_text()


def test_k8s_indexed_job(tmp_path: Path, profile_writer: Any) -> None:
    plan = _gpu_plan(tmp_path, 4, profile_writer)
    plan_id, records = read_plan(plan)
    (path,) = emit(["k8s"], plan, plan_id, records, "store", parallel=2, image="registry.local/kvstudy:1")
    job = yaml.safe_load(path.read_text())
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 4 and spec["parallelism"] == 2
    (container,) = spec["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["image"] == "registry.local/kvstudy:1"
    assert '--index "$JOB_COMPLETION_INDEX"' in container["command"][-1]
    subprocess.run(["sh", "-n", "-c", container["command"][-1]], check=True)


def test_skypilot_task_and_cpu_plans_ask_for_no_gpu(tmp_path: Path, bundled_plan: Path, profile_writer: Any) -> None:
    plan = _gpu_plan(tmp_path / "gpu", 2, profile_writer)
    plan_id, records = read_plan(plan)
    (path,) = emit(["skypilot"], plan, plan_id, records, "store", parallel=1)
    task = yaml.safe_load(path.read_text())
    assert task["resources"]["accelerators"] == "H100-SXM:2" and "KVSTUDY_BLOCK" in task["envs"]
    assert '--index "$KVSTUDY_BLOCK"' in task["run"]
    cpu_id, cpu_records = read_plan(bundled_plan)
    slurm, k8s = emit(["slurm", "k8s"], bundled_plan, cpu_id, cpu_records, "store", parallel=1)
    assert "--gres" not in "".join(x for x in slurm.read_text().splitlines() if x.startswith("#SBATCH"))
    assert "resources" not in yaml.safe_load(k8s.read_text())["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(StudyError, match="--parallel 0"):
        emit(["slurm"], bundled_plan, cpu_id, cpu_records, "store", parallel=0)
