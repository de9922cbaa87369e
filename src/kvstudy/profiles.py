"""Profiles: YAML files in ``profiles/`` that give each notebook its parameters, checked strictly.

A profile names the notebooks it runs (``notebooks: {stem: {parameter: value}}``), may take another
profile's settings with ``extends: NAME`` and may give ``defaults`` for every notebook that declares
them. Every key is checked against the parameters the notebook declares in its ``parameters`` cell
(read with papermill's inspector), every value against the declared default's type, before
anything runs; an error is one line naming the profile, the notebook and the key.
``kvstudy profile new`` writes a commented one for a new model (:func:`write_profile`).
"""

from __future__ import annotations

import ast
import datetime as dt
import difflib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import TypeAdapter, ValidationError

from kvstudy.bench.spec import Spec, one_line
from kvstudy.context.spec import ContextSweepSpec
from kvstudy.decision_rule import Thresholds
from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import find_gpu
from kvstudy.io import REPO_ROOT, check_write_target, is_finite_number, read_yaml, short_repr, write_text_atomic
from kvstudy.limits import (
    MAX_AXIS_VALUES,
    MAX_EXTENDS,
    AxisCount,
    Blocks,
    Factor,
    Gib,
    Items,
    MemoryGib,
    Shots,
    TensorParallel,
    Threads,
    Tokens,
    check_numbers,
)
from kvstudy.load.spec import LoadSpec
from kvstudy.speed.spec import SweepSpec

PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Parameters the runner sets itself; a profile may not set them.
RUNNER_PARAMETERS = ("profile", "figures_dir")
# Notebooks whose parameters fill a declared spec: a parameter named as one of its fields is checked
# by that field's declaration (type, bound), before any notebook runs.
SPECS: dict[str, type[Spec]] = {
    "02_speed-sweep": SweepSpec,
    "05_context-scaling": ContextSweepSpec,
    "08_load-at-equal-memory": LoadSpec,
}
# The bounds of the other notebooks' count and size parameters (a number, or each number of a list),
# the bounded types of kvstudy.limits.
PARAMETER_BOUNDS: dict[str, Any] = {
    **dict.fromkeys(
        ("context_len", "contexts", "retrieval_lengths", "max_model_len", "max_length", "max_gen_toks"), Tokens
    ),
    "published_context_len": Tokens,
    "fixed_pool_tokens": Blocks,
    **dict.fromkeys(("n", "gsm8k_n", "control_gsm8k_n", "greedy_n", "retrieval_per_length", "n_boot"), Items),
    "num_fewshot": Shots,
    "calibration_runs_per_arm": AxisCount,
    **dict.fromkeys(("tensor_parallel_size", "compare_tp"), TensorParallel),
    "cpu_kvcache_space_gib": Gib,
    **dict.fromkeys(("overhead_gib", "gpu_memory_gib", "weights_gib"), MemoryGib),
    "threads": Threads,
    **dict.fromkeys(("bandwidth_factor", "control_factor"), Factor),
}
_UNPARSED = object()
# The names a notebook's annotation may use (a profile's YAML list stands for a tuple); ``Any`` is
# not one: a parameter annotated so is untyped.
_ANNOTATION_NAMES: dict[str, Any] = {
    "__builtins__": {},
    "Optional": Optional,
    "Union": Union,
    **{t.__name__: t for t in (int, float, str, bool, list, dict)},
    "tuple": list,
}


@dataclass(frozen=True)
class Parameter:
    """One parameter a notebook declares: its default and its type (None: not declared)."""

    default: Any
    annotation: Any


def check_profile_name(name: Any, where: str = "profile") -> str:
    """``name`` if it is a plain profile name (no folder, no suffix), else one line naming ``where``."""
    plain = isinstance(name, str) and PROFILE_NAME.match(name) and ".." not in name
    if not plain or name.endswith((".yaml", ".yml")):
        raise StudyError(
            f"{where}: {short_repr(name, 80)} is not a profile name; give the name of a file in profiles/ without "
            f"folder or .yaml (for example {'PROFILE=' if where == 'profile' else ''}reference)"
        )
    return str(name)


def _annotation(text: str, default: Any, help_text: str) -> Any:
    """The type a notebook annotates (``Optional[float]``, ``list``), else the type of its default (a
    number, or where the help text mentions None, also None); None where neither says a type."""
    if text != "None":
        try:  # papermill reads an annotation only of names, [ ], commas and spaces (no call, no attribute)
            return eval(text, _ANNOTATION_NAMES)  # noqa: S307 (names from _ANNOTATION_NAMES only)
        except Exception:
            return None
    if default is _UNPARSED or default is None:
        return None
    kind = list if isinstance(default, tuple) else type(default)
    number = isinstance(default, (int, float)) and not isinstance(default, bool)
    return kind | None if number or "None" in help_text else kind


def declared_parameters(notebook: Path) -> dict[str, Parameter]:
    """The parameters ``notebook`` declares in its ``parameters``-tagged cell, in order."""
    import papermill as pm

    try:
        raw = pm.inspect_notebook(str(notebook))
    except Exception as exc:  # papermill raises plain exceptions for unreadable notebooks
        raise StudyError(f"{notebook}: cannot read its parameters ({type(exc).__name__}: {exc})") from None
    out = {}
    for name, info in raw.items():
        try:
            default = ast.literal_eval(info.get("default") or "None")
        except (ValueError, SyntaxError):
            default = _UNPARSED
        annotation = _annotation(info.get("inferred_type_name") or "None", default, info.get("help") or "")
        out[name] = Parameter(default, annotation)
    return out


class _ProfileFile(Spec):
    """The keys a profile file may hold, each of its type (its parameters are checked against the notebooks)."""

    description: str = ""
    extends: Any = None  # a profile name: checked by load_profile, with the chain
    defaults: dict[str, Any] | None = None
    notebooks: dict[str, dict[str, Any] | None] | None = None
    decision: Thresholds | None = None


def load_profile(profile: str, profiles_dir: Path) -> dict[str, Any]:
    """``profiles/<profile>.yaml`` with ``extends`` resolved: ``description``, ``defaults``, ``notebooks``."""
    check_profile_name(profile)
    chain: list[str] = []
    layers: list[dict[str, Any]] = []
    name: str | None = profile
    while name is not None:  # follow extends iteratively: a long chain is refused, not a RecursionError
        path = profiles_dir / f"{name}.yaml"
        if not path.is_file():
            names = ", ".join(sorted(p.stem for p in profiles_dir.glob("*.yaml"))) or "none"
            where = f"{layers[-1]['path']}: extends: " if layers else ""
            raise StudyError(f"{where}{path}: no such profile (profiles available: {names})")
        data = read_yaml(path) or {}  # io's checked reader: size, nesting and alias limits
        if not isinstance(data, dict):
            raise StudyError(f"{path}: expected a mapping with 'description', 'defaults' and 'notebooks'")
        _ProfileFile.from_dict(data, str(path))
        chain.append(name)
        layers.append({**data, "path": str(path)})
        name = data.get("extends")
        if name is not None:  # a plain profile name, not one of the chain
            check_profile_name(name, f"{path}: extends")
            if name in chain:
                raise StudyError(f"{path}: extends: {name!r} makes a cycle ({' -> '.join([*chain, name])})")
            if len(chain) >= MAX_EXTENDS:
                raise StudyError(
                    f"{path}: extends: a chain of more than {MAX_EXTENDS} profiles, expected at most {MAX_EXTENDS}"
                )
    notebooks: dict[str, dict[str, Any]] = {}
    defaults: dict[str, Any] = {}
    decision: dict[str, Any] = {}
    for data in reversed(layers):  # the base first, each profile's own settings over it
        for stem, params in (data.get("notebooks") or {}).items():
            notebooks.setdefault(str(stem), {}).update(params or {})
        defaults.update(data.get("defaults") or {})
        decision.update(data.get("decision") or {})
    return {
        "description": layers[0].get("description", ""),
        "extends": layers[0].get("extends"),
        "defaults": defaults,
        "notebooks": notebooks,
        "decision": decision or None,
        "path": layers[0]["path"],
    }


def validate_profile(profile_data: dict[str, Any], notebooks_dir: Path) -> dict[str, dict[str, Parameter]]:
    """Check every notebook name and parameter of a loaded profile; the declared parameters per notebook."""
    path = profile_data.get("path", "profile")
    available = {p.stem for p in notebooks_dir.glob("*.ipynb")}
    declared: dict[str, dict[str, Parameter]] = {}
    for stem in profile_data["notebooks"]:
        if stem not in available:
            raise StudyError(
                f"{path}: notebook {stem!r} is not in notebooks/ (notebooks: {', '.join(sorted(available))})"
            )
        declared[stem] = declared_parameters(notebooks_dir / f"{stem}.ipynb")
    for key in profile_data["defaults"]:
        if not any(key in params for params in declared.values()):
            raise StudyError(f"{path}: defaults: no notebook of this profile declares {key!r}")
    for stem, params in profile_data["notebooks"].items():
        where = f"{path}: notebook {stem}"
        for key, value in params.items():
            named = f"{where}: parameter {key!r}"
            if key in RUNNER_PARAMETERS:
                raise StudyError(f"{named} is set by the runner, not by a profile")
            if key not in declared[stem]:
                close = [f"; did you mean {c!r}?" for c in difflib.get_close_matches(key, list(declared[stem]), n=1)]
                raise StudyError(
                    f"{where}: unknown parameter {key!r}{''.join(close)} (declared: {', '.join(declared[stem])})"
                )
            annotation = declared[stem][key].annotation
            if annotation is None:  # `x = None` with no annotation: any value would pass unchecked
                raise StudyError(
                    f"{named} is declared without a type in {stem}.ipynb, so its value "
                    f"cannot be checked: annotate it there, e.g. `{key}: Optional[float] = None`"
                )
            # every number finite and not huge, a list of at most MAX_AXIS_VALUES items, a count or size
            # parameter (or each number of its list) within its bound (PARAMETER_BOUNDS), then its type
            check_numbers(value, named)
            if isinstance(value, list) and len(value) > MAX_AXIS_VALUES:
                raise StudyError(f"{named}: {len(value):,} items, expected at most {MAX_AXIS_VALUES:,}")
            numbers = [v for v in (value if isinstance(value, list) else [value]) if is_finite_number(v)]
            try:
                for item in numbers if key in PARAMETER_BOUNDS else []:
                    TypeAdapter(PARAMETER_BOUNDS[key]).validate_python(item)
                TypeAdapter(annotation).validate_python(value, strict=True)
            except ValidationError as exc:
                raise StudyError(f"{named}: {one_line(exc)}") from None
        if stem in SPECS:
            SPECS[stem].check_given(params, where)
    return declared


def given_parameters(profile_data: dict[str, Any], stem: str, declared: dict[str, Parameter]) -> dict[str, Any]:
    """The values the profile gives ``stem``: its defaults the notebook declares, then its own keys."""
    params = {k: v for k, v in profile_data["defaults"].items() if k in declared}
    params.update(profile_data["notebooks"].get(stem) or {})
    return params


# --------------------------------------------------------------------------- kvstudy profile new

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
    """``kvstudy profile new NAME --model M [--gpu G]``: write a commented profile for a new model.

    The profile it writes renders as it is (``make all PROFILE=NAME``): the capacity notebook on the
    model (the GPU's memory from the GPU catalog when ``--gpu`` names one) and the scale inspection of
    the model folder. The live notebooks (speed, accuracy) are listed commented out, with what they need.
    Only parameters the notebooks declare are written, and the result is checked like any profile.

    Writes ``profiles/<name>.yaml`` and checks it; an existing profile is kept unless ``force``.
    """
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
