"""The study's accuracy configurations: what each one's server runs and how its eval is asked.

``CONFIGURATIONS`` names every configuration a capture folder may hold (its sub-folder names);
configurations that share a ``server_key`` share one server start. ``server_config_for`` is the
baseline ``ServerConfig`` with only a configuration's intended changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.tools.tiny_model import DEFAULT_PATH as TINY_MODEL_PATH


@dataclass(frozen=True)
class EvalConfig:
    """One configuration of the study: what the server runs and how the eval is asked."""

    name: str  # folder name, e.g. "fp8-kv"
    label: str  # table label, e.g. "FP8 KV cache"
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype
    quantization: str | None = None  # --quantization (weights)
    num_fewshot: int | None = None  # None: the run's shots; 0 for a zero-shot weak baseline
    intended: tuple[str, ...] = ()  # fields allowed to differ from the baseline's record
    repeat: int = 0  # > 0: the same server settings started afresh (A/A control)
    # another model than the run's (only for a weak baseline of the discrimination check)
    model: str | None = None

    def server_key(self) -> tuple[str, str | None, int, str | None]:
        return (self.kv_cache_dtype, self.quantization, self.repeat, self.model)


CONFIGURATIONS: dict[str, EvalConfig] = {
    c.name: c
    for c in (
        EvalConfig("bf16", "BF16"),
        EvalConfig("fp8-weights", "FP8 weights", quantization="fp8", intended=("quantization",)),
        EvalConfig("fp8-kv", "FP8 KV cache", kv_cache_dtype="fp8", intended=("kv_cache_dtype",)),
        EvalConfig(
            "fp8-weights-fp8-kv",
            "FP8 weights + FP8 KV",
            kv_cache_dtype="fp8",
            quantization="fp8",
            intended=("kv_cache_dtype", "quantization"),
        ),
        EvalConfig("bf16-zero-shot", "BF16, zero-shot", num_fewshot=0),
        EvalConfig("bf16-repeat", "BF16, repeat", repeat=1),  # 16-bit vs 16-bit: the noise floor
        # A weak baseline for a model trained on the task's format, which answers zero-shot as well
        # as few-shot: the random-weight tiny model (`make tiny-model`), asked the same questions.
        EvalConfig("random-weights", "random weights (tiny model)", model=str(TINY_MODEL_PATH), intended=("model",)),
    )
}


def configurations(names: Sequence[str]) -> list[EvalConfig]:
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise StudyError(f"configurations: unknown {unknown}; expected some of {sorted(CONFIGURATIONS)}")
    return [CONFIGURATIONS[n] for n in names]


def server_config_for(cfg: EvalConfig, base: Any, fp8_kv_backend: str | None = None) -> Any:
    """The baseline ServerConfig with only this configuration's intended changes; ``fp8_kv_backend``
    sets the attention backend of the FP8-KV configurations only (the A/B guard reports it).
    """
    backend = fp8_kv_backend if fp8_kv_backend and cfg.kv_cache_dtype != "auto" else base.attention_backend
    model = cfg.model if cfg.model is not None else base.model
    return replace(
        base, model=model, kv_cache_dtype=cfg.kv_cache_dtype, quantization=cfg.quantization, attention_backend=backend
    )
