"""KV-cache capacity math: bytes per token and per request, tokens per GiB.

From a model's layout (``kvstudy.model.layout``) with vLLM 0.32's per-layer rules
(``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``): full attention grows with
every token, MLA stores one latent per token (``fp8_ds_mla`` / ``nvfp4_ds_mla``: a fixed 656 / 352
bytes), sliding-window and chunked layers stop at their window, KV-shared layers store nothing and
state layers keep a fixed state per request; under tensor parallelism each GPU holds
``max(1, kv_heads // tp)`` KV heads and MLA's whole latent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.formats import GIB
from kvstudy.io import is_finite_number, short_repr
from kvstudy.model.layout import (
    CHUNKED,
    FULL,
    INDEXER,
    LINEAR,
    MLA,
    SHARED,
    SLIDING,
    LayerSpec,
    ModelLayout,
    load_layout,
)
from kvstudy.vllm.facts import DTYPE_BYTES, MLA_SPECIAL_BYTES, SPARSE_MLA_QUANTIZED_AS

KV_DTYPES: tuple[str, ...] = ("auto", *DTYPE_BYTES, *MLA_SPECIAL_BYTES)


@dataclass(frozen=True)
class KVFootprint:
    """KV bytes for one model and one KV dtype."""

    resolved_dtype: str  # what the attention layers store
    bytes_per_token: float  # what one more token adds in a long context (growing layers only)
    bytes_per_token_short: float  # what one token adds while every sliding window is still open
    state_bytes_per_request: int  # fixed state of linear-attention layers, per request
    context_len: int
    bytes_per_request: float  # a request of context_len tokens, all layer kinds
    cap_tokens: int | None = None  # every layer windowed or chunked: a request stops growing here,
    #                                and bytes_per_token is the cost per token within the window
    bytes_per_token_by_kind: dict[str, float] = field(default_factory=dict)  # one token, per layer kind
    bytes_per_token_per_gpu: float = 0.0  # on one GPU of the tensor-parallel group
    state_bytes_per_request_per_gpu: int = 0
    bytes_per_request_per_gpu: float = 0.0

    @property
    def kib_per_token(self) -> float:
        return self.bytes_per_token / 1024

    @property
    def tokens_per_gib(self) -> float:
        return tokens_per_gib(self.bytes_per_token)


def resolve_kv_dtype(layout: ModelLayout, kv_dtype: str) -> str:
    """The dtype the attention layers store for a --kv-cache-dtype value."""
    if kv_dtype not in KV_DTYPES:
        raise StudyError(f"kv dtype {kv_dtype!r}: unknown (expected one of {', '.join(KV_DTYPES)})")
    if kv_dtype == "auto":
        kv_dtype = layout.kv_scheme_dtype or layout.model_dtype
    if kv_dtype in MLA_SPECIAL_BYTES and not layout.count(MLA):
        raise StudyError(f"kv dtype {kv_dtype!r}: only for MLA models, and {layout.config_path} has no MLA layers")
    if layout.count(INDEXER) and kv_dtype not in MLA_SPECIAL_BYTES:
        if kv_dtype not in ("bfloat16", "float16", "float32"):  # sparse MLA: quantized as fp8_ds_mla
            return SPARSE_MLA_QUANTIZED_AS
    return kv_dtype


def check_skip_layers(skip_layers: str | None) -> set[str]:
    """The items of --kv-cache-dtype-skip-layers: 'sliding_window' and layer indices in ASCII digits
    (``str.isdigit`` also takes '²'), as text without leading zeros."""
    items = [item.strip() for item in str(skip_layers).split(",")] if skip_layers else []
    if any(item != "sliding_window" and not re.fullmatch(r"[0-9]{1,6}", item, re.ASCII) for item in items):
        raise StudyError(f"skip layers {skip_layers!r}: expected 'sliding_window' or comma-separated layer indices")
    return {item if item == "sliding_window" else str(int(item)) for item in items}


def kv_heads_per_gpu(layer: LayerSpec, tensor_parallel_size: int) -> int:
    """The KV heads one GPU of a TP group holds: ``max(1, kv_heads // tp)`` of an attention layer
    (replicated when tp > kv_heads, vllm/model_executor/layers/linear.py QKVParallelLinear); MLA's
    single latent and the indexer's keys whole on every GPU."""
    if layer.kind in (FULL, SLIDING, CHUNKED):
        return max(1, layer.num_kv_heads // tensor_parallel_size)
    return layer.num_kv_heads


def layer_bytes_per_token(
    layer: LayerSpec, dtype: str, model_dtype: str, skip_layers: str | None = None, tensor_parallel_size: int = 1
) -> Fraction:
    """KV bytes one token costs in one layer on one GPU (0 for a state or KV-shared layer)."""
    if layer.kind in (LINEAR, SHARED):
        return Fraction(0)
    if layer.stored_bytes:  # the indexer's uint8 keys: their own size
        return Fraction(layer.head_size * layer.stored_bytes)
    skipped = check_skip_layers(skip_layers)  # --kv-cache-dtype-skip-layers keeps these in the model dtype
    if str(layer.index) in skipped or (layer.kind == SLIDING and "sliding_window" in skipped):
        dtype = model_dtype
    if layer.kind == MLA and dtype in MLA_SPECIAL_BYTES:
        return Fraction(MLA_SPECIAL_BYTES[dtype])
    heads = kv_heads_per_gpu(layer, tensor_parallel_size)
    return heads * (layer.head_size + layer.head_size_v) * DTYPE_BYTES[dtype]


def state_bytes(layer: LayerSpec, model_dtype: str, tensor_parallel_size: int = 1) -> int:
    """A state layer's fixed state per request on one GPU (conv and temporal state; the dtypes vLLM uses:
    the model dtype unless the family says otherwise, vllm/model_executor/layers/mamba/mamba_utils.py)."""
    if layer.state is None:
        return 0
    values = zip(layer.state.values(tensor_parallel_size), layer.state_dtypes)
    return int(sum((n * DTYPE_BYTES[dtype or model_dtype] for n, dtype in values), Fraction(0)))


def check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise StudyError(f"{name} {short_repr(value)}: expected a positive integer")
    return value


def check_number(value: Any, name: str, high: float = math.inf) -> float:
    """A finite number in (0, high] (the bandwidth factor: achievable over peak bandwidth, at most 1)."""
    if not is_finite_number(value) or not 0 < value <= high:
        expected = "a positive number" if high == math.inf else f"a number in (0, {high:g}]"
        raise StudyError(f"{name} {value!r}: expected {expected}")
    return float(value)


def check_context(layout: ModelLayout, context_len: Any, allow_long: bool = False) -> int:
    """A positive context length within the config's ``max_position_embeddings``, beyond which vLLM refuses
    a --max-model-len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (``allow_long``: count it anyway)."""
    length = check_positive_int(context_len, "context")
    limit = layout.max_position_embeddings
    if limit and length > limit and not allow_long:
        raise StudyError(
            f"context {length:,}: beyond {layout.config_path}'s max_position_embeddings {limit:,} (vLLM refuses "
            "it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; `kvstudy capacity --allow-long-context` counts it anyway)"
        )
    return length


def default_context_len(layout: ModelLayout) -> int:
    """The request length when none is given: the config's ``max_position_embeddings``, from which
    vLLM derives its default ``--max-model-len``."""
    if not layout.max_position_embeddings:
        raise StudyError(
            f"context length: {layout.config_path} has no max_position_embeddings to default to; "
            "give one (e.g. --max-model-len 4096)"
        )
    return layout.max_position_embeddings


def kv_footprint(
    model: str | Path | ModelLayout,
    kv_dtype: str = "auto",
    context_len: int | None = None,
    skip_layers: str | None = None,
    tensor_parallel_size: int = 1,
) -> KVFootprint:
    """Bytes per token (long context), per token (short context) and per request of ``context_len``,
    for the whole model and for one GPU of a ``tensor_parallel_size`` group."""
    layout = load_layout(model)
    check_skip_layers(skip_layers)
    check_positive_int(tensor_parallel_size, "tensor_parallel_size")
    dtype = resolve_kv_dtype(layout, kv_dtype)
    length = default_context_len(layout) if context_len is None else check_positive_int(context_len, "context length")

    def totals(tp: int) -> tuple[Fraction, Fraction, Fraction, int, list[Fraction]]:
        """(bytes per token of the growing layers, of all layers, per request with the state, state bytes,
        bytes per token of each layer)."""
        costs = [layer_bytes_per_token(l, dtype, layout.model_dtype, skip_layers, tp) for l in layout.layers]
        state = sum(state_bytes(l, layout.model_dtype, tp) for l in layout.layers)
        kept = [min(length, l.sliding_window or length) for l in layout.layers]  # only windows and chunks stop
        request = sum((c * n for n, c in zip(kept, costs)), Fraction(0)) + state
        growing = sum((c for l, c in zip(layout.layers, costs) if l.kind in (FULL, MLA, INDEXER)), Fraction(0))
        return growing, sum(costs, Fraction(0)), request, state, costs

    growing, short, per_request, state, costs = totals(1)
    kinds = dict.fromkeys(l.kind for l in layout.layers)
    by_kind = {k: sum((c for l, c in zip(layout.layers, costs) if l.kind == k), Fraction(0)) for k in kinds}
    caps = [l.sliding_window for l in layout.layers if l.sliding_window]
    cap_tokens = max(caps) if growing == 0 and caps else None
    gpu_token, gpu_short, gpu_request, gpu_state, _ = totals(tensor_parallel_size)
    return KVFootprint(
        resolved_dtype=dtype,
        bytes_per_token=_plain(growing if growing else short),
        bytes_per_token_short=_plain(short),
        state_bytes_per_request=state,
        context_len=length,
        bytes_per_request=_plain(per_request),
        cap_tokens=cap_tokens,
        bytes_per_token_by_kind={k: _plain(v) for k, v in by_kind.items()},
        bytes_per_token_per_gpu=_plain(gpu_token if growing else gpu_short),
        state_bytes_per_request_per_gpu=gpu_state,
        bytes_per_request_per_gpu=_plain(gpu_request),
    )


def _plain(value: Fraction) -> int | float:
    """An int when the value is whole (so JSON shows 147456, not 147456.0), else a float."""
    return int(value) if value.denominator == 1 else float(value)


def tokens_per_gib(bytes_per_token: float) -> float:
    if bytes_per_token <= 0:
        raise StudyError(f"bytes per token {bytes_per_token!r}: expected a positive number")
    return GIB / bytes_per_token


def footprint_table(
    model: str | Path | ModelLayout, kv_dtypes: list[str], context_len: int, skip_layers: str | None = None
) -> Any:
    """One row per KV dtype: bytes and KiB per token, tokens per GiB, MiB per request (a DataFrame)."""
    import pandas as pd

    rows = []
    for dtype in kv_dtypes:
        fp = kv_footprint(model, dtype, context_len, skip_layers)
        rows.append(
            {
                "kv dtype": dtype,
                "stored as": fp.resolved_dtype,
                "bytes per token": fp.bytes_per_token,
                "KiB per token": fp.kib_per_token,
                "tokens per GiB": fp.tokens_per_gib if fp.bytes_per_token else float("nan"),
                "fixed state per request (MiB)": fp.state_bytes_per_request / 2**20,
                f"MiB per {context_len:,}-token request": fp.bytes_per_request / 2**20,
            }
        )
    return pd.DataFrame(rows).set_index("kv dtype")


def compare_models(
    models: list[str | Path] | list[ModelLayout], context_len: int, dtypes: tuple[str, str] = ("auto", "fp8")
) -> Any:
    """One row per model: layer kinds and, for two KV dtypes, KiB per token and tokens per GiB."""
    import pandas as pd

    rows = []
    for model in models:
        layout = load_layout(model)
        kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in layout.layer_kinds.items())
        windows = ", ".join(str(w) for w in layout.sliding_windows)
        row: dict[str, Any] = {"model": layout.name, "layers": kinds + (f" (window {windows})" if windows else "")}
        for dtype in dtypes:
            fp = kv_footprint(layout, dtype, context_len)
            label = "16-bit" if dtype == "auto" else dtype
            row[f"KiB/token {label}"] = fp.kib_per_token
            row[f"tokens/GiB {label}"] = fp.tokens_per_gib
            row[f"MiB/request {label}"] = fp.bytes_per_request / 2**20
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")
