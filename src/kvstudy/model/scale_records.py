"""The records of a scale inspection: one KV scale tensor, one model folder's report, and what a
startup log or run record says the engine did."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ScaleTensor:
    """One KV scale tensor as stored (a deprecated ``kv_scale`` yields one record per kind)."""

    layer: int | None  # the first dotted number in the name (decoder layer), None if none
    kind: str  # "k" or "v" (query scales are kept apart, see ScaleReport.q_scales)
    name: str
    file: str  # the safetensors file it was read from, relative to the model folder
    dtype: str
    shape: list[int]
    values: list[float]
    style: str  # which of vLLM's naming conventions it follows


@dataclass
class ScaleReport:
    """Everything KV-related found in one model folder, with verdicts and input errors."""

    source: str  # what was asked for: a folder, a config.json or a cache id
    folder: str | None  # the resolved model folder, None if it could not be resolved
    kv_cache_dtype_in_config: str | None = None  # config.json's KV dtype, wherever it is declared
    kv_cache_dtype_field: str | None = None  # where: "kv_cache_dtype", "quantization_config.kv_cache_dtype", ...
    torch_dtype: str | None = None  # config.json torch_dtype (or dtype, transformers 5)
    quant_method: str | None = None  # quantization_config.quant_method
    kv_scheme: dict[str, Any] | None = None  # quantization_config.kv_cache_scheme as written
    kv_scheme_strategy: str | None = None  # its strategy: "tensor", "attn_head", ...
    kv_cache_quant_algo: str | None = None  # ModelOpt's, from hf_quant_config.json or quantization_config
    kv_cache_quant_algo_file: str | None = None  # which file declared it
    num_hidden_layers: int | None = None
    num_key_value_heads: int | None = None
    weights: str = "none"  # "safetensors", "bin-only" (not inspectable) or "none"
    files_read: list[str] = field(default_factory=list)
    scales: list[ScaleTensor] = field(default_factory=list)
    q_scales: list[ScaleTensor] = field(default_factory=list)
    bytes_read: int = 0
    config_read: bool = False
    verdicts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files_unread: list[str] = field(default_factory=list)  # inputs that could not be read (exit non-zero)
    checked_against: str | None = None  # the startup log or run record the verdicts used
    engine_outcome: str | None = None  # against that log: a key of scale_verdicts.OUTCOME_TEXT

    @property
    def has_scales(self) -> bool:
        return bool(self.scales)

    @property
    def readable(self) -> bool:
        """Whether anything at all could be read (config or a safetensors header)."""
        return self.config_read or bool(self.files_read)

    def scale_layers(self, kind: str) -> list[int]:
        return sorted({s.layer for s in self.scales if s.kind == kind and s.layer is not None})

    def span(self, kind: str | None = None) -> tuple[float, float] | None:
        """The smallest and largest finite scale value (of one kind), None when there is none."""
        finite = [v for s in self.scales if kind in (None, s.kind) for v in s.values if math.isfinite(v)]
        return (min(finite), max(finite)) if finite else None

    def per_head(self) -> bool:
        return any(len(s.values) > 1 for s in self.scales)

    def styles(self) -> str:
        return "; ".join(sorted({s.style for s in self.scales}))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for scale in data["scales"] + data["q_scales"]:
            scale["values"] = [_json_number(v) for v in scale["values"]]
        return data | {"has_scales": self.has_scales, "readable": self.readable}


@dataclass
class EngineEvidence:
    """What a startup log or resolved-run record says the engine did about the KV cache."""

    source: str
    kv_cache_dtype: str | None  # the dtype the engine stored the KV cache in ("auto" counts as not FP8)
    kv_scale_warning: bool  # the "Using KV cache scaling factor 1.0" warning was printed
    version: str | None
    failed: bool = False  # the start failed
    weights_processed: bool = True  # the log goes past weight loading (pool sized, or ready)
    failure_cause: str | None = None


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def declared_kv_dtype(report: ScaleReport) -> str | None:
    """The KV dtype the folder itself declares (kv_cache_dtype field, kv_cache_scheme or ModelOpt algo)."""
    if report.kv_cache_dtype_in_config is not None:
        return report.kv_cache_dtype_in_config
    if report.kv_scheme is not None:
        bits, kind = report.kv_scheme.get("num_bits"), report.kv_scheme.get("type")
        return "fp8" if (bits, kind) == (8, "float") else f"{kind}{bits}"
    if report.kv_cache_quant_algo is not None:
        return report.kv_cache_quant_algo.lower()
    return None
