"""The declared specs of the grid experiments, the one arm type of every A/B, and the grid types the
users grids share.

Each experiment's spec (``speed.spec.SweepSpec``, ``context.spec.ContextSweepSpec``,
``load.spec.LoadSpec``) is a :class:`Spec`: a pydantic model in strict mode, one declaration per
field (type, bound from ``kvstudy.limits``, default, meaning) from which the checks of a spec file,
a manifest, a notebook's parameters and a profile all follow. A boolean is not an integer, ``"5"``
is not a number, an unknown key is refused, and every refusal is one StudyError line naming the
field (:func:`one_line`, the one place pydantic's errors become ours).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from kvstudy.errors import StudyError
from kvstudy.io import type_name
from kvstudy.limits import MAX_ARMS, MAX_AXIS_VALUES, Seconds, Seed
from kvstudy.redact import redact
from kvstudy.vllm.command import check_server_args, check_server_env
from kvstudy.vllm.facts import CACHE_DTYPES

T = TypeVar("T")


def one_line(exc: ValidationError) -> str:
    """pydantic's first error as ``<field>: what was wrong, what was expected`` (one line)."""
    return error_line(exc.errors(include_url=False)[0])


def error_line(err: ErrorDetails) -> str:
    """One of pydantic's errors as ``<field>: what was wrong, what was expected``."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    msg = re.sub(r"^\w+ should (be |have )?", "expected ", str(err["msg"]).removeprefix("Value error, "))
    msg = msg.replace("expected match", "expected to match").replace(" after validation", "")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "a required field is missing"
    elif not err["type"].startswith(("value_error", "assertion_error")):
        value = err.get("input")
        shown = repr(value) if isinstance(value, (bool, int, float, str)) or value is None else type_name(value)
        msg = f"{msg}, got {shown[:60]}"
    return f"{where}: {msg}" if where else msg


def checked(check: Callable[[Any, str], object]) -> AfterValidator:
    """A kvstudy check ``check(value, where)`` as a field validator: its StudyError is the field's error."""

    def run(value: T) -> T:
        try:
            check(value, "")
        except StudyError as exc:
            raise ValueError(str(exc).lstrip(":. ")) from None
        return value

    return AfterValidator(run)


def _distinct(values: list[T]) -> list[T]:
    """``values`` with no value (an arm: no name) twice."""
    keys = [getattr(v, "name", v) for v in values]
    if len(set(map(repr, keys))) != len(keys):
        raise ValueError(f"{keys!r}: expected no value twice")
    return values


class Spec(BaseModel):
    """A declared spec: strict, unknown keys refused, no NaN or infinity, never changed once built."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    @classmethod
    def from_dict(cls, data: Any, where: str = "spec") -> Self:
        """The spec from plain data (a spec file, a manifest, a profile); bad input: one StudyError line."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise StudyError(f"{where}: {one_line(exc)}") from None

    @classmethod
    def from_params(cls, where: str = "notebook parameters", **params: Any) -> Self:
        """The spec from parameters named as its fields; None means the field's default (declared here only)."""
        return cls.from_dict({k: v for k, v in params.items() if v is not None}, where)

    @classmethod
    def check_given(cls, params: Mapping[str, Any], where: str) -> None:
        """Each of ``params`` named as a field (None: the default) checked by its declaration, without
        the fields not given or the checks across fields (a profile that only reads a capture need not
        fill the grid)."""
        try:
            cls.model_validate({k: v for k, v in params.items() if v is not None and k in cls.model_fields})
        except ValidationError as exc:
            errors = [e for e in exc.errors() if e["loc"] and e["type"] != "missing"]
            if errors:
                raise StudyError(f"{where}: {error_line(errors[0])}") from None

    def to_dict(self) -> dict[str, Any]:
        """The spec as stored in a manifest: secrets redacted (``{from_env: NAME}`` kept as is)."""
        out: dict[str, Any] = redact(self.model_dump())
        return out


# Field types the specs share.
Env = Annotated[dict[str, Any], checked(check_server_env)]  # variable: a string or {from_env: NAME}
ExtraArgs = Annotated[list[str], checked(check_server_args)]
Axis = Annotated[list[T], Field(min_length=1, max_length=MAX_AXIS_VALUES), AfterValidator(_distinct)]
Seeds = Axis[Seed]
RunOrder = Literal["abba", "grouped"]
RUN_ORDERS = {
    "abba": "seeds in turn; arms in order at even seed positions, reversed at odd ones",
    "grouped": "seeds in turn; arms always in the listed order",
}


class ServerSpec(Spec):
    """The server and client settings of every users grid (pydantic lists these fields first)."""

    enforce_eager: bool = Field(False, description="True: no CUDA graphs")
    server_env: Env = Field(
        default_factory=dict, description='extra server environment, e.g. {"VLLM_USE_FLASHINFER_SAMPLER": "0"}'
    )
    server_extra_args: ExtraArgs = Field(default_factory=list, description="extra server arguments")
    telemetry_interval_s: Seconds = Field(0.5, description="/metrics sampling interval during each cell")
    ready_timeout_s: Seconds = Field(900.0, description="seconds a server may take to become ready")
    bench_timeout_s: Seconds = Field(1800.0, description="seconds one cell's benchmark client may take")
    run_order: RunOrder = Field("abba", description='"abba" (arms alternate over seeds) or "grouped"')


def _cache_dtype(value: str) -> str:
    if value not in CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {value!r}, expected one of {', '.join(CACHE_DTYPES)}")
    return value


class Arm(Spec):
    """One KV arm of every experiment's A/B (the speed sweep's ``configurations``, the context and load
    sweeps' ``arms``: the notebooks' parameter names): its name, the KV dtype, and the attention
    backend, environment and server flags it sets on top of what the whole grid sets."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9._-]+$", max_length=100, description="file-safe name: letters, digits, - _ ."
    )
    kv_cache_dtype: Annotated[str, AfterValidator(_cache_dtype)] = Field("auto", description="vLLM's --kv-cache-dtype")
    attention_backend: str | None = Field(None, pattern=r"^[A-Za-z0-9_]+$", description="None: vLLM's choice")
    env: Env = Field(default_factory=dict, description="server environment on top of the grid's")
    extra_args: ExtraArgs = Field(default_factory=list, description="server flags on top of the grid's")


Arms = Annotated[list[Arm], Field(min_length=1, max_length=MAX_ARMS), AfterValidator(_distinct)]


# --------------------------------------------------------------------------- the users grids' cells


@dataclass(frozen=True)
class Run:
    """One server start: an arm at a seed."""

    arm: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.arm}__s{self.seed}"


def ordered_runs(arms: list[str], seeds: list[int], run_order: str) -> list[Run]:
    """Server starts in execution order (:data:`RUN_ORDERS`): seeds outer, arms inner; with "abba"
    every other seed runs the arms in reverse (seed 0 A B, seed 1 B A, ...), so no arm always runs
    first and a drift in time is spread over both arms."""
    out = []
    for i, s in enumerate(seeds):
        out += [Run(a, s) for a in (arms[::-1] if run_order == "abba" and i % 2 else arms)]
    return out


@dataclass(frozen=True)
class Cell:
    """One bench run: an arm at a seed with a number of concurrent users; ``tag`` spells the axis in
    the cell's id (``u`` for the speed sweep's users, ``c`` for the load ladder's concurrency)."""

    arm: str
    seed: int
    users: int
    tag: str = "u"

    @property
    def id(self) -> str:
        return f"{self.arm}__s{self.seed}__{self.tag}{self.users}"

    @property
    def run(self) -> Run:
        return Run(self.arm, self.seed)


@dataclass(kw_only=True)
class CellResult:
    """What ``cells/<cell>.json`` holds in every users grid; each experiment adds its own fields."""

    cell_id: str
    kv_cache_dtype: str
    seed: int
    status: str  # "ok" or "failed"
    reason: str = ""  # why it failed
    log_tail: str = ""  # tail of the server (or client) log on failure
    metrics: dict[str, Any] | None = None  # CellMetrics recomputed from the requests
    vllm_metrics: dict[str, Any] | None = None  # what vLLM's client reported
    settings: dict[str, Any] | None = None
    started_utc: str = ""
    seconds: float = 0.0
    server_metrics_before: dict[str, float] | None = None  # vLLM /metrics (queue, preemptions) before the cell
    server_metrics_after: dict[str, float] | None = None
