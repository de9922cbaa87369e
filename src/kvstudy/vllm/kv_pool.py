"""vLLM's own pool code as the oracle of the logged pool: KV memory -> blocks, tokens, concurrency.

The functions behind vLLM 0.32's ``KV cache size: N tokens, Maximum concurrency for L tokens per
request: X.XXx`` line (``vllm/v1/core/kv_cache_utils.py``: ``get_kv_cache_groups``,
``get_kv_cache_config_from_groups``, ``get_max_concurrency_for_kv_cache_config``) run in a child
process (as ``kv_specs`` does: the caller never imports vLLM) on per-layer specs given as plain
records (``FullAttentionSpec``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``,
``MLAAttentionSpec``, ``MambaSpec``), with only the engine settings those functions read.

``vllm_pools`` answers, per case, ``{"ok": True, "pools": [{"memory", "num_blocks", "tokens",
"max_concurrency"}]}`` or ``{"ok": False, "error": one line}``; ``KVSTUDY_NO_VLLM=1`` turns it off.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from kvstudy.vllm.kv_specs import MARKER, _one_line, oracle_disabled, run_child


def vllm_pools(
    cases: list[tuple[list[dict[str, Any]], list[int]]],
    max_model_len: int,
    max_in_flight_tokens: int,
    mamba_cache_mode: str = "none",
) -> list[dict[str, Any]]:
    """vLLM's pool for each ``(layers, KV memory figures in bytes)`` case, in one child process.

    A layer record is ``{"kind" (full_attention, sliding_attention, chunked_local_attention, mla),
    "block_size", "dtype" (bfloat16, float16, float32, fp8), "num_kv_heads", "head_size", "head_size_v",
    "window"}``, or for a state layer (linear_attention) ``{"kind", "block_size", "state_bytes",
    "page_bytes"}``. Each answer: ``{"ok": True, "pools": [...]}`` or ``{"ok": False, "error": one line}``."""
    reason = oracle_disabled()
    if reason:
        return [{"ok": False, "error": reason} for _ in cases]
    request = {
        "cases": [{"layers": layers, "memories": [int(m) for m in memories]} for layers, memories in cases],
        "max_model_len": int(max_model_len),
        "max_in_flight_tokens": int(max_in_flight_tokens),
        "mamba_cache_mode": mamba_cache_mode,
    }
    answer = run_child({"key": request}, module="kvstudy.vllm.kv_pool")
    if "__error__" in answer:
        return [{"ok": False, "error": answer["__error__"]} for _ in cases]
    answers: list[dict[str, Any]] = answer["key"]  # the child answers every case, refusals included
    return answers


# --------------------------------------------------------------------------- the child (imports vLLM)


def _spec(layer: dict[str, Any], torch: Any, interface: Any) -> Any:
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "fp8": torch.uint8}
    kind, block = layer["kind"], int(layer["block_size"])
    if kind == "linear_attention":
        return interface.MambaSpec(
            block_size=block,
            shapes=((int(layer["state_bytes"]),),),
            dtypes=(torch.uint8,),
            page_size_padded=int(layer["page_bytes"]),
        )
    common = {
        "block_size": block,
        "num_kv_heads": int(layer["num_kv_heads"]),
        "head_size": int(layer["head_size"]),
        "dtype": dtype[layer["dtype"]],
    }
    if kind == "mla":
        return interface.MLAAttentionSpec(**common)
    common["head_size_v"] = int(layer["head_size_v"])
    if kind == "sliding_attention":
        return interface.SlidingWindowSpec(sliding_window=int(layer["window"]), **common)
    if kind == "chunked_local_attention":
        return interface.ChunkedLocalAttentionSpec(attention_chunk_size=int(layer["window"]), **common)
    return interface.FullAttentionSpec(**common)


def _pools(request: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.v1 import kv_cache_interface as interface
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_layout import KVCacheLayout

    config = SimpleNamespace(  # the settings the three pool functions read, at vLLM's defaults
        model_config=SimpleNamespace(max_model_len=request["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        cache_config=SimpleNamespace(
            num_gpu_blocks_override=None,
            mamba_cache_mode=request["mamba_cache_mode"],
            prefix_cache_retention_interval=None,
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        max_in_flight_tokens=request["max_in_flight_tokens"],
    )
    specs = {f"model.layers.{i}.attn": _spec(layer, torch, interface) for i, layer in enumerate(case["layers"])}
    groups = kv_cache_utils.get_kv_cache_groups(config, specs)
    pools = []
    for memory in case["memories"]:
        kv_config = kv_cache_utils.get_kv_cache_config_from_groups(config, groups, memory)
        concurrency = kv_cache_utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
        pools.append(
            {
                "memory": memory,
                "num_blocks": kv_config.num_blocks,
                "tokens": int(concurrency * request["max_model_len"]),
                "max_concurrency": concurrency,
            }
        )
    return {"ok": True, "pools": pools}


def child() -> None:
    """Entry of the child process: read the request on stdin, print one marked JSON line."""
    request = json.loads(sys.stdin.read())["key"]
    answers = []
    for case in request["cases"]:
        try:
            answers.append(_pools(request, case))
        except Exception as exc:  # vLLM refused the specs or the figures: one line back
            answers.append({"ok": False, "error": _one_line(exc)})
    print(MARKER + json.dumps({"key": answers}), flush=True)
