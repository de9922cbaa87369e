"""One arm of an A/B, the same for every experiment: a name, the KV dtype, and what else it sets.

The speed sweep calls its arms ``configurations`` and the context and load sweeps ``arms`` (the
notebooks' parameter names); all hold :class:`Arm` records (:data:`Arms`: named once each).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from kvstudy.bench.spec import Env, ExtraArgs, Spec
from kvstudy.limits import MAX_ARMS
from kvstudy.vllm.facts import CACHE_DTYPES


def _cache_dtype(value: str) -> str:
    if value not in CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {value!r}, expected one of {', '.join(CACHE_DTYPES)}")
    return value


class Arm(Spec):
    """One KV arm: its name, the KV dtype, and the attention backend, environment and server flags
    it sets on top of what the whole grid sets."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9._-]+$", max_length=100, description="file-safe name: letters, digits, - _ ."
    )
    kv_cache_dtype: Annotated[str, AfterValidator(_cache_dtype)] = Field("auto", description="vLLM's --kv-cache-dtype")
    attention_backend: str | None = Field(None, pattern=r"^[A-Za-z0-9_]+$", description="None: vLLM's choice")
    env: Env = Field(default_factory=dict, description="server environment on top of the grid's")
    extra_args: ExtraArgs = Field(default_factory=list, description="server flags on top of the grid's")


def _distinct_names(arms: list[Arm]) -> list[Arm]:
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"names repeat: {names}, expected each once")
    return arms


Arms = Annotated[list[Arm], Field(min_length=1, max_length=MAX_ARMS), AfterValidator(_distinct_names)]
