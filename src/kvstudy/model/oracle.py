"""A model's KV layout from vLLM's own specs where vLLM can build it, else from the project's rules.

``resolve_layouts`` answers with the rules of ``kvstudy.model.layout`` (``source = "kvstudy rules"``)
wherever they know the family, and asks vLLM (``kvstudy.vllm.kv_specs``: the model built on the meta
device, every layer's ``get_kv_cache_spec``; the answer kept on disk per config and vLLM version) only
where they cannot: the specs become the same :class:`ModelLayout`, marked ``source = "vLLM 0.32 kv
cache specs"``. ``tests/unit/model/test_oracle.py`` keeps comparing the two on every fixture. A model
neither can read is refused in one line naming both reasons (the family among them). ``--assume``
bypasses vLLM: the rules of the family named. ``KVSTUDY_VLLM_SPECS=always`` asks vLLM for every model
of at most ``limits.MAX_POOL_CODE_LAYERS`` layers the rules read (a larger build takes minutes).

The tensor-parallel sizes vLLM refuses (``ModelConfig.verify_with_parallel_config``: attention heads
divisible by TP; ``QKVParallelLinear``: TP divides the KV heads or they divide TP) are kept in
``ModelLayout.tp_refused``; :func:`tp_problem` gives the reason for one size on either path.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.limits import MAX_LAYERS, MAX_POOL_CODE_LAYERS
from kvstudy.model.config_fields import load_config, usable_int
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
    StateShape,
    layout_from_config,
    new_layout,
    text_config,
)
from kvstudy.vllm.facts import KV_SPECS_SOURCE
from kvstudy.vllm.kv_specs import oracle_disabled, read_specs

SPEC_KINDS = {
    "FullAttentionSpec": FULL,
    "SlidingWindowSpec": SLIDING,
    "ChunkedLocalAttentionSpec": CHUNKED,
    "MLAAttentionSpec": MLA,
    "MambaSpec": LINEAR,
}
DEFAULT_TPS = (1, 2, 4, 8)
RULES_KNOW = (
    "the rules know this family (vLLM's specs are asked only where they cannot answer, or with "
    "KVSTUDY_VLLM_SPECS=always; tests/unit/model/test_oracle.py compares both)"
)


def tp_problem(config: dict[str, Any], tp: int) -> str | None:
    """Why vLLM refuses tensor-parallel size ``tp`` for this config, or None (vLLM's two rules)."""
    cfg = text_config(config)
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    if not isinstance(heads, int) or heads <= 0:
        return None
    if heads % tp:
        return f"TP {tp}: the {heads} attention heads are not divisible by {tp} (vLLM refuses it)"
    if cfg.get("kv_lora_rank") is None and isinstance(kv, int) and kv > 0 and (kv % tp if tp < kv else tp % kv):
        return (
            f"TP {tp}: the {kv} KV heads neither divide nor are divisible by {tp} (vLLM's QKVParallelLinear asserts it)"
        )
    return None


def layout_from_specs(
    answer: dict[str, Any], rules: ModelLayout | None, where: str, config: dict[str, Any]
) -> ModelLayout:
    """A ModelLayout whose layers are vLLM's specs (TP 1 for the shapes, every TP read for the states)."""
    tps = {int(tp): r for tp, r in answer["tps"].items() if "layers" in r}
    first = tps[1]
    layers: list[LayerSpec] = []
    for pos, record in enumerate(first["layers"]):
        index = record["index"]
        if record.get("family") == "shared":
            layers.append(LayerSpec(index, SHARED))
            continue
        kind = SPEC_KINDS.get(str(record.get("spec")))
        if kind is None:
            raise StudyError(
                f"{where}: vLLM's spec {record.get('spec')} (layer {record['name']}) is not known to kvstudy"
            )
        if kind == LINEAR:
            per_tp = {tp: r["layers"][pos] for tp, r in tps.items() if len(r["layers"]) == len(first["layers"])}
            by_tp = tuple(sorted((tp, tuple(int(math.prod(s)) for s in r["shapes"])) for tp, r in per_tp.items()))
            state = StateShape("specs", 0, 0, 0, 0, 0, by_tp=by_tp)  # element counts per TP, from each MambaSpec
            layers.append(LayerSpec(index, LINEAR, state=state, state_dtypes=tuple(record["dtypes"])))
            continue
        if kind == MLA and record.get("dtype") == "uint8" and "k_cache" in str(record.get("name")):
            layers.append(LayerSpec(index, INDEXER, 1, record.get("head_size", 0), 0, stored_bytes=1))
            continue  # the sparse-MLA indexer's keys (DeepseekV32IndexerCache)
        if record.get("dtype") not in ("bfloat16", "float16", "float32"):
            raise StudyError(f"{where}: vLLM's spec of {record['name']} stores {record.get('dtype')} (not modelled)")
        window = record.get("sliding_window") if kind == SLIDING else record.get("attention_chunk_size")
        heads, k, v = record.get("num_kv_heads", 1), record.get("head_size", 0), record.get("head_size_v", 0)
        layers.append(
            LayerSpec(index, kind, heads, k, 0 if kind == MLA else v, window if kind in (SLIDING, CHUNKED) else None)
        )
    ordered = sorted(answer["tps"].items(), key=lambda x: int(x[0]))
    refused = tuple((int(tp), r["error"]) for tp, r in ordered if r.get("refused"))
    unbuilt = tuple(
        f"TP {tp}: vLLM could not build the model here ({r['error'][:160]}); its split at TP {tp} is the rules'"
        for tp, r in ordered
        if "error" in r and not r.get("refused")
    )
    base = rules or new_layout(
        config,
        where,
        architecture=answer["architecture"],
        model_dtype=first["model_dtype"] if first["model_dtype"] in ("bfloat16", "float16") else "bfloat16",
        layers=(),
        num_hidden_layers=max(
            usable_int(text_config(config).get("num_hidden_layers"), MAX_LAYERS) or 0,
            max((layer.index for layer in layers), default=-1) + 1,
        ),
    )
    notes = tuple(answer.get("notes") or ()) + unbuilt
    return dataclasses.replace(
        base, layers=tuple(layers), source=KV_SPECS_SOURCE, tp_refused=refused, notes=base.notes + notes, warnings=()
    )


def resolve_layouts(
    models: list[str | Path], assume: str | None = None, tps: tuple[int, ...] = DEFAULT_TPS
) -> list[ModelLayout]:
    """The KV layout of each model: vLLM's specs when vLLM can build it, else the rules (one child for all)."""
    loaded: list[tuple[str, dict[str, Any], ModelLayout | None, str | None]] = []
    for model in models:
        config, path = load_config(model)
        try:
            loaded.append((str(path), config, layout_from_config(config, str(path), assume), None))
        except StudyError as exc:
            loaded.append((str(path), config, None, str(exc)))
    always = os.environ.get("KVSTUDY_VLLM_SPECS", "") == "always"
    big = {  # a model whose build would take minutes on the meta device: the rules answer
        where: f"vLLM is not asked to build {len(r.layers):,} layers (limits.MAX_POOL_CODE_LAYERS)"
        for where, _, r, _ in loaded
        if r and len(r.layers) > MAX_POOL_CODE_LAYERS
    }
    asked = [
        (where, config)
        for where, config, rules, _ in loaded
        if assume is None and (always and where not in big or not rules)
    ]
    answers = read_specs(asked, tps) if asked else {}
    out = []
    for where, config, rules, reason in loaded:
        answer = answers.get(where)
        if answer and answer.get("ok"):
            try:
                out.append(layout_from_specs(answer, rules, where, config))
                continue
            except StudyError as exc:
                answer = {"ok": False, "error": str(exc)}
        why = (
            "--assume given"
            if assume
            else (answer or {}).get("error") or big.get(where) or oracle_disabled() or RULES_KNOW
        )
        if rules is None:
            raise StudyError(f"{reason}; vLLM could not read it either ({why})")
        refused = tuple((tp, p) for tp in tps if (p := tp_problem(config, tp)))
        note = f"KV figures from the kvstudy rules, not vLLM's specs: {why}"
        out.append(dataclasses.replace(rules, notes=rules.notes + (note,), tp_refused=refused))
    return out


def resolve_layout(model: str | Path, assume: str | None = None, tps: tuple[int, ...] = DEFAULT_TPS) -> ModelLayout:
    return resolve_layouts([model], assume, tps)[0]
