"""Simulated KV-cache storage: K and V rounded the way vLLM stores them, then read back.

vLLM's FP8 KV cache writes ``clamp(x / scale, -max, max)`` as ``float8_e4m3fn`` (or ``e5m2``) and
multiplies by ``scale`` again when attention reads it (``scaled_fp8_conversion`` saturates; it
never writes NaN). A 16-bit cache stores ``x`` rounded to ``bfloat16``. :func:`store` does the same
in PyTorch, element by element, so quantizing on write and quantizing on read give the same
numbers; a transformers model computes attention over the result through :func:`attention`, a
function registered in transformers' attention registry (``ATTENTION_NAME``).

This is **simulated storage (PyTorch), not vLLM's kernels**: same rounding, other arithmetic.

torch is imported inside the functions: the analysis environment (no torch) imports this module's
constants only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstudy.errors import StudyError

ATTENTION_NAME = "kvstudy_kv_storage"
LABEL = "simulated storage (PyTorch), not vLLM's kernels"
# the largest finite value of each format (torch.finfo(torch.float8_e4m3fn).max etc.)
FORMAT_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "int8": 127.0}
FORMATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int8_per_token_head")


@dataclass(frozen=True)
class Storage:
    """How one arm stores K and V: a format and, for FP8, one scale per layer (None: 1.0)."""

    name: str
    format: str  # one of FORMATS
    k_scales: tuple[float, ...] | None = None  # per layer; None: scale 1.0 everywhere
    v_scales: tuple[float, ...] | None = None
    kernel: str = "sdpa"  # "sdpa", or "eager" (the A/A arm: the same storage through another kernel)
    scales_from: str = "1.0"  # where the scales came from: "1.0", "checkpoint", "calibration"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise StudyError(f"storage {self.name}: format {self.format!r}, expected one of {', '.join(FORMATS)}")
        if self.kernel not in ("sdpa", "eager"):
            raise StudyError(f"storage {self.name}: kernel {self.kernel!r}, expected sdpa or eager")
        for scales in (self.k_scales, self.v_scales):
            if scales is not None and not all(s > 0 and s == s and s != float("inf") for s in scales):
                raise StudyError(f"storage {self.name}: scales must be finite and > 0, got {list(scales)}")

    def scale(self, kind: str, layer: int) -> float:
        scales = self.k_scales if kind == "k" else self.v_scales
        if scales is None:
            return 1.0
        if layer >= len(scales):
            raise StudyError(f"storage {self.name}: no {kind} scale for layer {layer} ({len(scales)} given)")
        return float(scales[layer])


def store(x: Any, storage: Storage, kind: str, layer: int) -> Any:
    """One layer's K (``kind`` "k") or V ("v") as ``storage`` keeps it, read back: rounded to
    bfloat16 (a 16-bit KV cache); int8 with one scale per token and head (max |x| over head_dim /
    127); FP8 divided by its scale, saturated, rounded and multiplied again (the format and scale as
    :class:`Storage` checked them)."""
    import torch

    if storage.format == "bfloat16":
        return x.to(torch.bfloat16).to(x.dtype)
    if storage.format == "int8_per_token_head":
        amax = x.float().abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax > 0, amax / FORMAT_MAX["int8"], torch.ones_like(amax))
        return (torch.round(x.float() / scale).clamp(-127, 127) * scale).to(x.dtype)
    limit, scale = FORMAT_MAX[storage.format], storage.scale(kind, layer)
    scaled = (x.float() / scale).clamp(-limit, limit)
    return (scaled.to(getattr(torch, storage.format)).float() * scale).to(x.dtype)


@dataclass
class _State:
    """What the registered attention function does now (one simulator runs at a time)."""

    storage: Storage | None = None
    observe: bool = False  # record max |K| and |V| per layer (calibration)
    amax: dict[tuple[str, int], float] = field(default_factory=dict)


STATE = _State()


def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """The registered attention function: K and V through the current storage, then attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layer = int(getattr(module, "layer_idx", 0))
    if STATE.observe:
        for kind, tensor in (("k", key), ("v", value)):
            seen = float(tensor.detach().abs().max())
            STATE.amax[(kind, layer)] = max(STATE.amax.get((kind, layer), 0.0), seen)
    storage = STATE.storage
    if storage is not None:
        key = store(key, storage, "k", layer)
        value = store(value, storage, "v", layer)
    if storage is not None and storage.kernel == "eager":
        return matmul_attention(module, query, key, value, attention_mask, float(kwargs["scaling"]))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def matmul_attention(module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float) -> tuple[Any, None]:
    """Attention written out (matmul, mask, softmax, matmul): the same numbers as SDPA up to the
    order of the floating-point sums. ``mask`` None means causal (aligned at the last query)."""
    import torch

    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    q_len, kv_len = query.shape[-2], key.shape[-2]
    if mask is None and q_len > 1:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    # a query row with every key masked (left padding) gives NaN; zero it, as SDPA's mask fix does
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).nan_to_num(0.0).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def calibrated_scales(amax: dict[tuple[str, int], float], layers: int, fmt: str) -> tuple[tuple[float, ...], ...]:
    """Per-layer (k, v) scales ``max |x| / format max`` from observed maxima (vLLM's rule)."""
    limit = FORMAT_MAX[fmt]
    out = []
    for kind in ("k", "v"):
        missing = [i for i in range(layers) if (kind, i) not in amax]
        if missing:
            raise StudyError(f"calibration: no {kind} maximum for layers {missing} (no calibration prompt ran?)")
        out.append(tuple(max(amax[(kind, i)], 1e-12) / limit for i in range(layers)))
    return tuple(out)


def checkpoint_scales(folder: str, layers: int) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None, str]:
    """Per-layer k and v scales a checkpoint carries (read by ``kvstudy.model.scales``).

    Per-head scales are reduced to their maximum (one scale per layer, as this simulator keeps);
    a kind without scales gives None (vLLM then uses 1.0). The third value says what was found.
    """
    from kvstudy.model.scales import inspect_model

    report = inspect_model(folder)
    found: list[tuple[float, ...] | None] = []
    notes = []
    for kind in ("k", "v"):
        per_layer: dict[int, float] = {}
        for tensor in report.scales:
            if tensor.kind == kind and tensor.layer is not None and tensor.values:
                per_layer[tensor.layer] = max(per_layer.get(tensor.layer, 0.0), max(tensor.values))
        if not per_layer:
            found.append(None)
            notes.append(f"no {kind} scales (1.0)")
            continue
        missing = [i for i in range(layers) if i not in per_layer]
        if missing:
            raise StudyError(f"{folder}: {kind} scales for layers {sorted(per_layer)}, missing {missing}")
        values = tuple(per_layer[i] for i in range(layers))
        found.append(values)
        style = next(t.style for t in report.scales if t.kind == kind)
        notes.append(f"{kind} scales ({style}) {[round(v, 4) for v in values]}")
    return found[0], found[1], "; ".join(notes)
