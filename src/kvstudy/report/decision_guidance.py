"""Published usage guidance for an FP8 KV cache, evaluated on one model and GPU, only where it holds.

vLLM's FP8 KV-cache update publishes a usage table: hybrid sliding-window models keep those layers
16-bit, head size 256 with prefill priority stays 16-bit, and contexts below a decode break-even stay
16-bit. That break-even was measured on H100 and B200 (Llama-3.1-8B); for any other GPU the card says
"not published for this GPU", and on an L4 adds what the vLLM documentation's L4 table suggests,
labelled as a suggestion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import REPO_ROOT, read_json

# vLLM's FP8 KV-cache update: decode break-even context for Llama-3.1-8B, by the GPU it was measured on.
PUBLISHED_BREAK_EVEN_TOKENS = {"H100": 7000, "B200": 4000}
DOCS_L4_TABLE = "data/published/vllm-docs-l4-qwen3-4b.json"
DOCS_L4_MODEL = "data/models/Qwen3-4B"


@dataclass(frozen=True)
class Guidance:
    """One row of the published usage table, evaluated on this model and GPU."""

    scenario: str
    published: str  # the table's recommendation, restated
    applies: bool | None  # None: the study cannot tell
    why: str


# --------------------------------------------------------------------------- published guidance


def docs_l4_crossing(layout: Any, root: Path = REPO_ROOT) -> float | None:
    """The context from which the vLLM documentation's L4 table (Qwen3-4B, FP8 vs BF16 throughput)
    suggests FP8 is faster, for a model of ``layout``'s KV bytes per token: the line through the table's
    two shortest contexts, where it crosses 0 %, scaled by Qwen3-4B's KV bytes per token over this
    model's (a model with more KV per token reads as much at a shorter context). A suggestion from
    published figures, not a measured break-even; None when the table or config is unreadable."""
    from kvstudy.model.capacity import kv_footprint, load_layout

    try:
        table = read_json(root / DOCS_L4_TABLE)
        points = sorted((float(r["context_tokens"]), float(r["fp8_throughput_change_pct"])) for r in table["rows"])[:2]
        (x1, y1), (x2, y2) = points
        crossing = x1 - y1 * (x2 - x1) / (y2 - y1)
        ratio = (
            kv_footprint(load_layout(root / DOCS_L4_MODEL), "auto", 4096).bytes_per_token
            / kv_footprint(layout, "auto", 4096).bytes_per_token
        )
    except (StudyError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return crossing * ratio if math.isfinite(crossing) and crossing > 0 else None


def evaluate_guidance(model: str | None, context_len: int | None, gpu: str | None = None) -> list[Guidance]:
    """vLLM's published usage table on this model and GPU: which rows apply, and why (or why the study cannot tell)."""
    from kvstudy.model.capacity import SLIDING, load_layout
    from kvstudy.model.plan import advised_skip_layers

    try:
        if not model:
            raise StudyError("no model named by the profile")
        layout = load_layout(model)
    except StudyError as exc:
        return [Guidance("model layout", "(needs the model's config)", None, str(exc))]
    out = []
    sliding = layout.count(SLIDING)
    windows = ", ".join(f"{w:,}" for w in layout.sliding_windows)
    hybrid = advised_skip_layers(layout) is not None
    out.append(
        Guidance(
            "hybrid attention (sliding-window and full-attention layers)",
            "FP8 with the sliding-window layers kept 16-bit (--kv-cache-dtype-skip-layers sliding_window)",
            hybrid,
            f"{sliding} of {len(layout.layers)} layers slide (window {windows} tokens); the card counts FP8 this way"
            if hybrid
            else f"all {sliding} layers slide (window {windows} tokens): not hybrid, FP8 stores every layer"
            if sliding
            else "no sliding-window layers",
        )
    )
    heads = sorted({layer.head_size for layer in layout.layers if layer.head_size})
    out.append(
        Guidance(
            "head size 256, prefill first",
            "stay 16-bit (FP8 prefill about 1.6x slower at long contexts, measured on H100), or validate",
            256 in heads,
            f"head size {', '.join(map(str, heads)) or 'none'}",
        )
    )
    key = (gpu or "").upper().replace(" ", "").replace("-", "")
    family = next((name for name in PUBLISHED_BREAK_EVEN_TOKENS if key.startswith(name)), None)
    if family is not None:
        even = PUBLISHED_BREAK_EVEN_TOKENS[family]
        out.append(
            Guidance(
                f"contexts below the {family} break-even (about {even:,} tokens, Llama-3.1-8B)",
                "stay 16-bit: FP8's fixed cost per step outweighs the halved KV reads",
                None if context_len is None else context_len < even,
                "no context length given"
                if context_len is None
                else f"the profile's context is {context_len:,} tokens",
            )
        )
    else:
        crossing = docs_l4_crossing(layout) if gpu and gpu.upper().startswith("L4") else None
        suggestion = (
            f"; the vLLM documentation's L4 throughput table (Qwen3-4B, users not published) suggests FP8 is "
            f"faster from about {crossing:,.0f} tokens for this model's KV size (a suggestion, not a measurement)"
            if crossing
            else ""
        )
        out.append(
            Guidance(
                "short contexts (below a break-even)",
                "stay 16-bit below the break-even",
                None,
                f"not published for {gpu or 'this GPU'} (only for H100 and B200){suggestion}",
            )
        )
    return out
