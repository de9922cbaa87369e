"""vLLM's block allocator: how KV memory becomes the pool a startup log reports.

``predict_logged_pool`` mirrors how vLLM 0.32 turns KV memory into the logged
``KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx`` line
(``vllm/v1/core/kv_cache_utils.py``: layers grouped by page size, blocks per request per group,
sliding windows capped at the window plus the tokens in flight, chunked local attention at the
chunk plus the tokens in flight, one state block per Mamba layer, two in the ``align`` prefix-cache
mode (``MambaSpec.max_memory_usage_bytes``); KV-shared layers (gemma-3n) hold no blocks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.model.capacity import (
    CHUNKED,
    LINEAR,
    MLA,
    SHARED,
    SLIDING,
    ModelLayout,
    check_positive_int,
    check_skip_layers,
    layer_bytes_per_token,
    load_layout,
    resolve_kv_dtype,
    state_bytes,
)
from kvstudy.vllm.command import server_option
from kvstudy.vllm.facts import DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING, DEVICE_DEFAULTS


@dataclass(frozen=True)
class LoggedPool:
    """The pool vLLM 0.32 logs: ``KV cache size: tokens``, ``Maximum concurrency: x``."""

    num_blocks: int
    tokens: int
    max_concurrency: float
    block_size: int
    bytes_per_block: int
    blocks_per_request: int
    num_groups: int


@dataclass(frozen=True)
class _Spec:
    """One layer's KV spec as vLLM's block allocator sees it."""

    kind: str
    block_size: int
    page_bytes: int
    sliding_window: int | None = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _blocks_per_request(spec: _Spec, max_model_len: int, max_in_flight_tokens: int, mamba_cache_mode: str) -> int:
    """vLLM 0.32 ``cdiv(max_memory_usage_bytes, page_size_bytes)`` for one layer spec."""
    if spec.kind == LINEAR:
        return 2 if mamba_cache_mode == "align" else 1
    if spec.kind == CHUNKED:  # ChunkedLocalAttentionSpec.max_admission_blocks_per_request
        return _cdiv(min((spec.sliding_window or 0) + max_in_flight_tokens, max_model_len), spec.block_size)
    if spec.kind == SLIDING:
        tokens = min((spec.sliding_window or 0) - 1 + max_in_flight_tokens, max_model_len)
        return _cdiv(tokens, spec.block_size) + 1
    return _cdiv(max_model_len, spec.block_size)


def _page(per_token: Fraction, block_size: int, where: str) -> int:
    page = per_token * block_size
    if page.denominator != 1:
        raise StudyError(f"{where}: block size {block_size} gives a fractional page ({float(page)} bytes)")
    return int(page)


def _layer_specs(layout: ModelLayout, dtype: str, block_size: int, skip_layers: str | None) -> list[_Spec]:
    """Per-layer specs; hybrid Mamba models raise the attention block size to fit one state."""
    layers = [l for l in layout.layers if l.kind != SHARED]
    per_token = [layer_bytes_per_token(l, dtype, layout.model_dtype, skip_layers) for l in layers]
    states = [state_bytes(l, layout.model_dtype) for l in layers if l.kind == LINEAR]
    if states:  # vLLM Platform._align_hybrid_block_size: attention page >= state, state padded to it
        one_token = max(p for p in per_token if p)
        block_size = block_size * _cdiv(max(states), int(block_size * one_token))
    specs = [
        _Spec(l.kind, block_size, _page(cost, block_size, layout.config_path), l.sliding_window)  # a state: 0 for now
        for l, cost in zip(layers, per_token)
    ]
    if states:
        attn_page = max(s.page_bytes for s in specs)
        specs = [_Spec(LINEAR, s.block_size, attn_page) if s.kind == LINEAR else s for s in specs]
    return specs


def _unify_page_sizes(specs: list[_Spec]) -> list[_Spec]:
    """vLLM ``unify_kv_cache_spec_page_size``: smaller pages get a larger block size (or padding)."""
    largest = max(s.page_bytes for s in specs)
    ratios = [largest // s.page_bytes if largest % s.page_bytes == 0 else 1 for s in specs]
    return [_Spec(s.kind, s.block_size * r, largest, s.sliding_window) for s, r in zip(specs, ratios)]


def _group(
    specs: list[_Spec], max_model_len: int, max_in_flight_tokens: int, mamba_cache_mode: str
) -> tuple[int, int, int]:
    """(bytes per block, blocks one max-length request needs, number of groups), as vLLM groups layers."""
    distinct_kinds = {(s.kind, s.block_size, s.sliding_window) for s in specs}
    if len(distinct_kinds) == 1:  # uniform type: one group holding every layer
        return (
            sum(s.page_bytes for s in specs),
            _blocks_per_request(specs[0], max_model_len, max_in_flight_tokens, mamba_cache_mode),
            1,
        )
    specs = _unify_page_sizes(specs)
    buckets = Counter(specs)
    smallest, largest = min(buckets.values()), max(buckets.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    bytes_per_block = blocks = groups = 0
    for spec, count in buckets.items():
        num_groups = _cdiv(count, group_size)
        widest = _cdiv(count, num_groups)
        bytes_per_block = max(bytes_per_block, widest * spec.page_bytes)
        blocks += num_groups * _blocks_per_request(spec, max_model_len, max_in_flight_tokens, mamba_cache_mode)
        groups += num_groups
    return bytes_per_block, blocks, groups


def predict_logged_pool(
    config: str | Path | ModelLayout,
    kv_cache_dtype: str,
    kv_memory_bytes: int,
    max_model_len: int,
    block_size: int | None = None,
    skip_layers: str | None = None,
    max_in_flight_tokens: int | None = None,
    num_blocks_override: int | None = None,
    device: str = "cuda",
    mamba_cache_mode: str = DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING,
) -> LoggedPool:
    """The pool vLLM 0.32 logs for ``kv_memory_bytes`` of KV memory (defaults: vLLM's for ``device``).

    Not mirrored: the packed layout some backends use for mixed page sizes, tensor/context
    parallelism, speculative-decoding layers, and the block-size alignment of the align mode.
    """
    if mamba_cache_mode not in ("none", "align"):
        raise StudyError(f"mamba_cache_mode {mamba_cache_mode!r}: expected 'none' or 'align'")
    if device not in DEVICE_DEFAULTS:
        raise StudyError(f"device {device!r}: expected one of {', '.join(DEVICE_DEFAULTS)}")
    defaults = DEVICE_DEFAULTS[device]
    block_size = defaults["block_size"] if block_size is None else block_size
    max_in_flight_tokens = defaults["max_in_flight_tokens"] if max_in_flight_tokens is None else max_in_flight_tokens
    layout = load_layout(config)
    check_skip_layers(skip_layers)
    dtype = resolve_kv_dtype(layout, kv_cache_dtype)
    names = ("kv_memory_bytes", "max_model_len", "block_size", "max_in_flight_tokens")
    for name, value in zip(names, (kv_memory_bytes, max_model_len, block_size, max_in_flight_tokens)):
        check_positive_int(value, name)
    if not any(l.kind not in (LINEAR, SHARED) for l in layout.layers):
        raise StudyError(f"{layout.config_path}: no attention layers, so no KV pool to predict")
    specs = _layer_specs(layout, dtype, block_size, skip_layers)
    bytes_per_block, blocks_per_request, groups = _group(specs, max_model_len, max_in_flight_tokens, mamba_cache_mode)
    num_blocks = num_blocks_override if num_blocks_override is not None else kv_memory_bytes // bytes_per_block
    concurrency = num_blocks / blocks_per_request
    used_block = min(s.block_size for s in specs if s.kind != LINEAR)
    tokens = int(concurrency * max_model_len)
    return LoggedPool(num_blocks, tokens, concurrency, used_block, bytes_per_block, blocks_per_request, groups)


VLLM_STORED = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "fp8": "fp8"}
VLLM_STORED |= {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}  # one byte each: vLLM stores them as uint8


def vllm_layer_records(
    config: str | Path | ModelLayout, kv_cache_dtype: str, block_size: int
) -> list[dict[str, object]] | None:
    """The per-layer specs :func:`predict_logged_pool` works from, as the records
    ``kvstudy.vllm.kv_specs.vllm_pools`` hands to vLLM's own pool code (the heads and sizes kept, so
    vLLM groups the layers as it would); None for a KV dtype that path does not build (nvfp4, the
    MLA-only formats)."""
    layout = load_layout(config)
    dtype = resolve_kv_dtype(layout, kv_cache_dtype)
    if dtype not in VLLM_STORED:
        return None
    layers = [l for l in layout.layers if l.kind != SHARED]
    specs = _layer_specs(layout, dtype, block_size, None)
    records: list[dict[str, object]] = []
    for layer, spec in zip(layers, specs):
        record: dict[str, object] = {"kind": layer.kind, "block_size": spec.block_size}
        if layer.kind == LINEAR:
            record.update(state_bytes=state_bytes(layer, layout.model_dtype), page_bytes=spec.page_bytes)
        else:
            record.update(
                dtype=VLLM_STORED[dtype],
                num_kv_heads=1 if layer.kind == MLA else layer.num_kv_heads,
                head_size=layer.head_size,
                head_size_v=layer.head_size_v,
                window=layer.sliding_window,
            )
        records.append(record)
    return records


def mamba_cache_mode_for(server_args: Sequence[Any]) -> str:
    """The mamba cache mode vLLM 0.32 runs hybrid models' state layers in for these server arguments
    (vllm/model_executor/models/config.py MambaModelConfig): "none" when prefix caching is off
    (``--no-enable-prefix-caching``), whatever ``--mamba-cache-mode`` says; with prefix caching on
    (the default) "align", unless ``--mamba-cache-mode`` names another mode than "none"."""
    if "--no-enable-prefix-caching" in map(str, server_args):
        return "none"
    explicit = server_option(server_args, "--mamba-cache-mode")
    return explicit if explicit not in (None, "none") else DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING


def kv_memory_for_pool(
    config: str | Path | ModelLayout,
    kv_cache_dtype: str,
    num_blocks: int,
    block_size: int | None = None,
    skip_layers: str | None = None,
    device: str = "cuda",
) -> int:
    """KV bytes a pool of ``num_blocks`` blocks occupies (the inverse of ``predict_logged_pool``)."""
    pool = predict_logged_pool(
        config, kv_cache_dtype, 1, 1, block_size, skip_layers, num_blocks_override=num_blocks, device=device
    )
    return pool.bytes_per_block * num_blocks


def format_logged_line(pool: LoggedPool, max_model_len: int, device: str = "GPU") -> str:
    """The pool as vLLM 0.32 logs it, for side-by-side reading with a startup log."""
    return (
        f"{device} KV cache size: {pool.tokens:,} tokens, Maximum concurrency for "
        f"{max_model_len:,} tokens per request: {pool.max_concurrency:.2f}x"
    )
