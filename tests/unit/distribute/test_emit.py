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


# --------------------------------------------------------------------------- shell text in values (issue 35)


def _fake_kvstudy(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH starts with a ``kvstudy`` that writes its arguments (one per line,
    NUL-separated) to ``argv.txt``: the emitted command lines are executed, not only parsed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "kvstudy"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {tmp_path / "argv.txt"}\n')
    fake.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_ARRAY_TASK_ID": "0",
        "JOB_COMPLETION_INDEX": "0",
        "KVSTUDY_BLOCK": "0",
    }


def _planted(marker: Path) -> list[str]:
    return [
        f"s`touch {marker}`",
        f"s$(touch {marker})",
        f"s'; touch {marker}; '",
        f's"; touch {marker}; "',
        f"s $(touch {marker}) *",
    ]


def _argv(tmp_path: Path) -> list[str]:
    return (tmp_path / "argv.txt").read_text().split("\0")[:-1]


@pytest.mark.parametrize("case", range(5))
def test_planted_commands_in_store_do_not_run(tmp_path: Path, bundled_plan: Path, case: int) -> None:
    """Each emitted file's command line, executed by its shell with a fake kvstudy: the planted
    command does not run and run-block receives the store exactly as given."""
    marker = tmp_path / "pwned"
    store = _planted(marker)[case]
    plan_id, records = read_plan(bundled_plan)
    slurm, k8s, sky = emit(["slurm", "k8s", "skypilot"], bundled_plan, plan_id, records, store, parallel=1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = _fake_kvstudy(tmp_path)
    subprocess.run(["bash", "-n", str(slurm)], check=True)
    subprocess.run(["bash", str(slurm)], check=True, cwd=run_dir, env=env)
    assert not marker.exists() and _argv(tmp_path)[-2:] == ["--store", store]
    assert (run_dir / store).is_dir()  # the script's mkdir -p made the store as named
    command = yaml.safe_load(k8s.read_text())["spec"]["template"]["spec"]["containers"][0]["command"]
    subprocess.run(["sh", "-n", "-c", command[-1]], check=True)
    subprocess.run(command, check=True, cwd=run_dir, env=env)
    assert not marker.exists() and _argv(tmp_path)[-2:] == ["--store", store]
    run = yaml.safe_load(sky.read_text())["run"]
    subprocess.run(["bash", "-n", "-c", run], check=True)
    subprocess.run(["bash", "-c", run], check=True, cwd=run_dir, env=env)
    assert not marker.exists() and _argv(tmp_path)[-2:] == ["--store", store + "/block-0"]
    assert _argv(tmp_path)[:2] == ["run-block", str(bundled_plan)]


@pytest.mark.parametrize("kind", ["slurm", "k8s", "skypilot"])
def test_a_newline_in_store_or_out_is_refused_before_anything_is_written(
    tmp_path: Path, bundled_plan: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstudy import cli

    marker = tmp_path / "pwned"
    plan_id, records = read_plan(bundled_plan)
    with pytest.raises(StudyError, match=r"--store .*control character '\\n'"):
        emit([kind], bundled_plan, plan_id, records, f"store\ntouch {marker}", parallel=1)
    assert not list(bundled_plan.glob("*.sbatch")) and not list(bundled_plan.glob("*.yaml"))
    profiles = tmp_path / "profiles"  # the bundled_plan fixture's profile "split"
    for option, value in (("--store", f"s\ntouch {marker}"), ("--out", str(tmp_path / f"p\rtouch {marker}"))):
        out = str(tmp_path / "p2") if option == "--store" else value
        argv = ["plan", "split", "--profiles", str(profiles), "--out", out, "--emit", kind]
        assert cli.main([*argv, "--store", value if option == "--store" else "s"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"kvstudy: error: {option} ") and "\n" not in err and "control character" in err
    assert not marker.exists() and not (tmp_path / "p2").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("p")) == ["plan", "profiles"]


def test_sbatch_output_directive_only_for_a_plain_store_path(tmp_path: Path, bundled_plan: Path) -> None:
    plan_id, records = read_plan(bundled_plan)
    (plain,) = emit(["slurm"], bundled_plan, plan_id, records, "runs/store-1", parallel=1)
    assert "#SBATCH --output=runs/store-1/slurm-%A_%a.log" in plain.read_text()
    (spaced,) = emit(["slurm"], bundled_plan, plan_id, records, "my store", parallel=1)
    assert "#SBATCH --output" not in spaced.read_text() and "mkdir -p 'my store'" in spaced.read_text()


def test_a_store_that_reads_as_an_option_is_refused(tmp_path: Path, bundled_plan: Path) -> None:
    plan_id, records = read_plan(bundled_plan)
    with pytest.raises(StudyError, match="--store '-rf': begins with '-'"):
        emit(["slurm"], bundled_plan, plan_id, records, "-rf", parallel=1)
    (path,) = emit(["slurm"], bundled_plan, plan_id, records, "./-rf", parallel=1)
    subprocess.run(["bash", "-n", str(path)], check=True)
