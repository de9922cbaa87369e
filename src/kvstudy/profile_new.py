"""``kvstudy profile new NAME --model M [--gpu G]``: write a commented profile for a new model.

The profile it writes renders as it is (``make all PROFILE=NAME``): the capacity notebook on the
model (the GPU's memory from the GPU catalog when ``--gpu`` names one) and the scale inspection of
the model folder. The live notebooks (speed, accuracy) are listed commented out, with what they need.
Only parameters the notebooks declare are written, and the result is checked like any profile.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tempfile
from pathlib import Path

from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import find_gpu
from kvstudy.io import REPO_ROOT, check_write_target, write_text_atomic
from kvstudy.profiles import check_profile_name, declared_parameters, load_profile, validate_profile

CAPACITY = "01_capacity-math"
SCALES = "04_scale-inspection"
# Study values that describe Qwen3-8B or the L4, not a new model: cleared when the notebook's default is one.
MODEL_SPECIFIC = {"weights_gib": "read or estimated from the model folder", "fixed_pool_tokens": "no pool held fixed"}


def profile_text(name: str, model: str, gpu: str | None, notebooks_dir: Path) -> str:
    """The commented YAML of a new profile for ``model`` (and ``gpu``)."""
    declared = declared_parameters(notebooks_dir / f"{CAPACITY}.ipynb")
    stamp = dt.date.today().isoformat()
    gpu_text = f" on {gpu}" if gpu else ""
    # json.dumps writes a scalar or list in flow style, which YAML reads back as the same value.
    lines = [
        f"# Profile {name}: {model}{gpu_text}. Written by `kvstudy profile new` on {stamp}.",
        f"# Render it with `make all PROFILE={name}`; one notebook: `make all PROFILE={name} ONLY={CAPACITY}`.",
        "# Each key must be a parameter the notebook declares: see",
        f"# `.venv/bin/papermill --help-notebook notebooks/{CAPACITY}.ipynb`.",
        "description: >-",
        f"  What an FP8 KV cache buys for {model}{gpu_text}: capacity from the model's config.json,",
        "  and the KV scales its checkpoint carries.",
        "notebooks:",
        f"  {CAPACITY}:",
        f"    model: {json.dumps(model)}  # a model folder, its config.json or a cached Hugging Face id",
        *([f"    gpu: {json.dumps(find_gpu(gpu).name)}  # from data/gpus/catalog.json"] if gpu else []),
        *(
            f"    {key}: null  # {meaning}"
            for key, meaning in MODEL_SPECIFIC.items()
            if declared[key].default is not None
        ),
        f"    # context_len: {declared['context_len'].default}  # tokens per request; uncomment to change",
        f"  {SCALES}:",
        f"    models: [{json.dumps(model)}]",
        f"    dump_root: {json.dumps(model)}  # every config.json under it is listed",
        "  # The live notebooks run vLLM (`make engine` first) and take long; uncomment to run them.",
        f"  # 02_speed-sweep: {{capture: captures/{name}/speed-sweep, run_missing: true, model: {json.dumps(model)}}}",
        f"  # 03_gsm8k-accuracy: {{capture_dir: captures/{name}/gsm8k, run_missing: true, model: {json.dumps(model)}}}",
        f"  # 06_retrieval-accuracy: {{capture_dir: captures/{name}/retrieval, run_missing: true, "
        f"model: {json.dumps(model)}}}",
    ]
    return "\n".join(lines) + "\n"


def write_profile(name: str, model: str, gpu: str | None, root: Path = REPO_ROOT, force: bool = False) -> Path:
    """Write ``profiles/<name>.yaml`` and check it; an existing profile is kept unless ``force``."""
    check_profile_name(name)
    path = check_write_target(root / "profiles" / f"{name}.yaml")  # a planted symlink is refused first
    if path.exists() and not force:
        raise StudyError(f"{path}: the profile exists (pass --force to replace it)")
    if any(ord(c) < 32 or ord(c) == 127 for c in model) or (gpu and any(ord(c) < 32 for c in gpu)):
        raise StudyError("--model/--gpu: control characters (a line break, a tab) are not allowed in a profile value")
    if re.search(r"://[^/@\s]*@", model):
        raise StudyError(
            "--model: a URL with credentials in it; a profile is a file others read: give the model without them"
        )
    text = profile_text(name, model, gpu, root / "notebooks")
    # Checked before anything is replaced: the new text is loaded and validated from a scratch
    # folder, so a profile that fails the check never costs the user the one it would replace.
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root / "profiles") as scratch:
        write_text_atomic(Path(scratch) / f"{name}.yaml", text)
        validate_profile(load_profile(name, Path(scratch)), root / "notebooks")
    write_text_atomic(path, text)
    return path
