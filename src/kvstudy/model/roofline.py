"""A memory-roofline model of one decode step: the bytes it reads, the time they take, FP8's gain.

One decode step of ``users`` requests, each holding ``context_len`` tokens, reads

* the **weights** read per step: the checkpoint's weights (``weights.weights_size`` or a given
  figure) less the input-embedding table when it is not tied to the output head (a step looks up
  one row per request, it does not stream the table), and for mixture-of-experts models less the
  experts no request routes to (uniform, independent routing of ``k`` of ``E`` experts per token is
  assumed: a given expert is touched with probability ``1 - (1 - k/E) ** users``). The parameter
  counts (all, embedding, routed experts) and ``E`` and ``k`` are :mod:`kvstudy.model.weights`'s;
* the **KV cache**, per layer kind: full-attention and MLA layers read every token of the context,
  sliding-window layers at most their window, linear-attention (state) layers a fixed state per
  request, read and written back once per step (counted twice);
* **activations**: per request and layer, about ``8 x hidden + 3 x MLP width`` 16-bit values
  written and read back, plus FP32 logits over the vocabulary (an estimate; at one request it is
  a few MB against GB of weights, so it only matters with many users).

The step time is ``bytes / (bandwidth x factor)``. The factor (achievable / peak bandwidth) is a
stated figure: ``DEFAULT_BANDWIDTH_FACTOR`` (assumed), or one the caller gives or measures. FP8's
predicted speedup is ``(TPOT_16bit / TPOT_fp8 - 1) x 100``; the factor cancels in it, so it is
also the largest gain the smaller KV reads can explain when a step is all memory traffic.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import find_gpu
from kvstudy.model.capacity import KVFootprint, check_context, check_number, check_positive_int, kv_footprint
from kvstudy.model.config_fields import load_config, text_config, usable_int
from kvstudy.model.layout import ModelLayout, load_layout
from kvstudy.model.weights import expert_routing, parameter_parts, weights_size
from kvstudy.vllm.facts import SIXTEEN_BIT

# Achievable / peak DRAM bandwidth for decode-time streaming reads. Assumed: the published
# Llama-3.1-8B BF16 ITL slope on an H100 (seed 003, 4.37e-05 ms/token for 131,072 B/token)
# implies 3.0 TB/s for the KV reads, 0.90 of the 3.35 TB/s datasheet figure. A device-to-device
# copy on an H200 reached 0.89 of its datasheet figure (measured: data/gpus/measured/).
DEFAULT_BANDWIDTH_FACTOR = 0.9
ACTIVATION_VALUE_BYTES = 2  # 16-bit activations
ACTIVATION_HIDDEN_VECTORS = 8  # norms, attention in/out, residual adds, per layer (estimate)
ACTIVATION_MLP_VECTORS = 3  # gate, up, activated product, per layer (estimate)
LOGIT_BYTES = 4  # FP32 logits over the vocabulary
MAX_SEARCH_TOKENS = 10**8  # upper end of the "KV dominates from" search when a model has no limit
FACTOR_NOTE = (
    "achievable/peak DRAM bandwidth; the published H100 BF16 ITL slope of Llama-3.1-8B (seed 003) implies 0.90 "
    "for KV reads"
)
ACTIVATION_NOTE = (
    f"{ACTIVATION_HIDDEN_VECTORS} x hidden + {ACTIVATION_MLP_VECTORS} x MLP width 16-bit values per layer, "
    "written and read back, plus FP32 logits"
)
STATE_NOTE = "linear-attention state read and written back once per step"
KV_READ_NOTE = "attention reads every cached token of its layer once per step; the new token's KV write is not counted"
UNKNOWN_PARAMETERS = "parameter count unknown: every weight byte is counted as read each step"


@dataclass(frozen=True)
class Assumption:
    """A figure the prediction depends on, with where it came from."""

    name: str
    value: Any
    unit: str
    origin: str  # "datasheet", "given", "measured", "assumed", "estimated", "model folder"
    note: str = ""


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step reads for one KV dtype."""

    kv_dtype: str
    resolved_dtype: str
    context_len: int
    users: int
    weights_bytes: float  # weights read per step
    kv_bytes: float  # attention KV, all requests
    state_bytes: float  # linear-attention state read + written, all requests
    activation_bytes: float  # all requests

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.state_bytes + self.activation_bytes

    @property
    def kv_share(self) -> float:
        return self.kv_bytes / self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total_bytes": self.total_bytes, "kv_share": self.kv_share}


@dataclass(frozen=True)
class WeightsRead:
    """The weights a decode step streams, and how the figure was reached."""

    total_bytes: int  # the checkpoint's (or given) weight bytes
    total_source: str
    read_bytes: float  # what one step reads at this user count
    embedding_bytes_skipped: float
    expert_bytes_skipped: float
    notes: tuple[str, ...]


@dataclass(frozen=True)
class RooflineResult:
    """Predicted bytes and TPOT per KV dtype at one context length and user count."""

    model: str
    config: str
    gpu: str | None
    context_len: int
    users: int
    bandwidth_gb_s: float
    bandwidth_factor: float
    steps: dict[str, StepBytes]
    predicted_tpot_ms: dict[str, float]
    predicted_itl_slope_ms_per_token: dict[str, float]
    kv_dominates_from_tokens: dict[str, int | None]
    baseline_dtype: str | None
    fp8_dtype: str | None
    fp8_speedup_pct: float | None
    fp8_tpot_reduction_pct: float | None
    weights: WeightsRead
    assumptions: tuple[Assumption, ...]

    def to_dict(self) -> dict[str, Any]:
        """The CLI's JSON object: every field, each step with its total and KV share."""
        return asdict(self) | {"steps": {k: s.to_dict() for k, s in self.steps.items()}}


def weights_read(model: str | Path | ModelLayout, users: int = 1, weights_bytes: int | None = None) -> WeightsRead:
    """Weight bytes one decode step streams (see the module docstring for what is left out)."""
    layout = load_layout(model)
    users = check_positive_int(users, "users")
    given = None if weights_bytes is None else check_number(weights_bytes, "weights bytes")
    size = weights_size(layout.config_path, layout, given)
    total, source = size.bytes, size.source
    config, path = load_config(layout.config_path)
    try:
        parts = parameter_parts(config, str(path))
    except StudyError:
        return WeightsRead(total, source, float(total), 0.0, 0.0, (UNKNOWN_PARAMETERS,))
    per_param = total / sum(parts.values())
    notes: list[str] = []
    embedding = parts["embedding"] * per_param if parts["output_head"] else 0.0
    if embedding:
        notes.append("untied input embedding (vocab x hidden) not streamed: one row per request is read")
    experts = 0.0
    count, k = expert_routing(config)
    if parts["experts"] and count and k:
        touched = 1 - (1 - k / count) ** users
        experts = parts["experts"] * per_param * (1 - touched)
        notes.append(
            f"MoE: {k} of {count} experts per token, uniform routing "
            f"assumed; {touched:.1%} of expert weights touched at {users} user(s)"
        )
    notes.append(f"{per_param:.3f} bytes per parameter (weights / estimated parameters), used for both parts")
    read = max(total - embedding - experts, 0.0)
    return WeightsRead(total, source, read, embedding, experts, tuple(notes))


def activation_bytes_per_request(model: str | Path | ModelLayout) -> float:
    """Estimated activation traffic of one request in one decode step (see ``ACTIVATION_*``)."""
    config, _ = load_config(load_layout(model).config_path)
    cfg = text_config(config, {})
    hidden, layers = usable_int(cfg.get("hidden_size")), usable_int(cfg.get("num_hidden_layers"))
    width = usable_int(cfg.get("intermediate_size"))
    expert_width = usable_int(cfg.get("moe_intermediate_size")) or width
    experts, k = expert_routing(config)
    if experts and k and expert_width and hidden and layers:  # MoE: the active experts' width
        shared = usable_int(cfg.get("shared_expert_intermediate_size"))
        width = k * expert_width + (shared or (usable_int(cfg.get("n_shared_experts")) or 0) * expert_width)
    if not (hidden and layers and width):
        return 0.0
    per_layer = 2 * ACTIVATION_VALUE_BYTES * (ACTIVATION_HIDDEN_VECTORS * hidden + ACTIVATION_MLP_VECTORS * width)
    return float(layers * per_layer + (usable_int(cfg.get("vocab_size")) or 0) * LOGIT_BYTES)


def step_bytes(
    model: str | Path | ModelLayout,
    kv_dtype: str,
    context_len: int,
    users: int = 1,
    weights_bytes: int | None = None,
    skip_layers: str | None = None,
    activation_bytes_per_user: float | None = None,
) -> StepBytes:
    """Bytes one decode step reads: weights + KV x requests + state + activations."""
    layout = load_layout(model)
    length = check_context(layout, context_len)
    users = check_positive_int(users, "users")
    fp: KVFootprint = kv_footprint(layout, kv_dtype, length, skip_layers)
    state = float(fp.state_bytes_per_request)
    kv_per_request = float(fp.bytes_per_request) - state
    acts = activation_bytes_per_request(layout) if activation_bytes_per_user is None else activation_bytes_per_user
    weights = weights_read(layout, users, weights_bytes).read_bytes
    return StepBytes(
        kv_dtype,
        fp.resolved_dtype,
        length,
        users,
        weights,
        kv_per_request * users,
        2 * state * users,
        float(acts) * users,
    )


def tpot_ms(total_bytes: float, bandwidth_gb_s: float, bandwidth_factor: float = DEFAULT_BANDWIDTH_FACTOR) -> float:
    bandwidth = check_number(bandwidth_gb_s, "bandwidth GB/s") * check_number(bandwidth_factor, "bandwidth factor", 1)
    return total_bytes / (bandwidth * 1e9) * 1e3


def speedup_pct(tpot_baseline_ms: float, tpot_candidate_ms: float) -> float:
    """``(TPOT_baseline / TPOT_candidate - 1) x 100``: positive when the candidate is faster."""
    return (tpot_baseline_ms / tpot_candidate_ms - 1) * 100


def predicted_slope_ms_per_token(
    model: str | Path | ModelLayout,
    kv_dtype: str,
    bandwidth_gb_s: float,
    bandwidth_factor: float = DEFAULT_BANDWIDTH_FACTOR,
    users: int = 1,
    skip_layers: str | None = None,
) -> float:
    """ITL growth per token of context beyond every window: growing KV bytes / effective bandwidth."""
    layout = load_layout(model)
    growing = float(kv_footprint(layout, kv_dtype, 1, skip_layers).bytes_per_token)
    return tpot_ms(growing * check_positive_int(users, "users"), bandwidth_gb_s, bandwidth_factor)


def kv_dominates_from(
    model: str | Path | ModelLayout,
    kv_dtype: str,
    users: int = 1,
    weights_bytes: int | None = None,
    skip_layers: str | None = None,
) -> int | None:
    """The shortest context at which the step's KV bytes reach the weights read; None if never.

    Searched up to the model's ``max_position_embeddings`` (or 10^8 tokens without one); a model
    whose every layer is windowed or a state can have no such length.
    """
    layout = load_layout(model)
    users = check_positive_int(users, "users")
    weights = weights_read(layout, users, weights_bytes).read_bytes
    limit = layout.max_position_embeddings or MAX_SEARCH_TOKENS

    def kv_at(length: int) -> float:
        fp = kv_footprint(layout, kv_dtype, length, skip_layers)
        return (fp.bytes_per_request - fp.state_bytes_per_request) * users

    if kv_at(limit) < weights:
        return None
    return 1 + bisect.bisect_left(range(1, limit + 1), True, key=lambda length: kv_at(length) >= weights)


def max_fp8_gain_pct(
    model: str | Path | ModelLayout, context_len: int, users: int = 1, skip_layers: str | None = None
) -> float:
    """The largest speedup the smaller FP8 KV reads can explain at this context and user count.

    Equal to the roofline's predicted speedup: a step that is all memory traffic at one
    bandwidth, so the bandwidth and its factor cancel. Measured changes above it need another cause.
    """
    base = step_bytes(model, "auto", context_len, users, skip_layers=skip_layers)
    cand = step_bytes(model, "fp8", context_len, users, skip_layers=skip_layers)
    return speedup_pct(base.total_bytes, cand.total_bytes)


def roofline(
    model: str | Path | ModelLayout,
    context_len: int,
    users: int = 1,
    gpu: str | None = None,
    kv_dtypes: list[str] | tuple[str, ...] | None = None,
    bandwidth_factor: float | None = None,
    bandwidth_gb_s: float | None = None,
    bandwidth_origin: str = "given",
    weights_bytes: int | None = None,
    skip_layers: str | None = None,
) -> RooflineResult:
    """Predicted bytes per step, TPOT, ITL slope and FP8 speedup for a model on a GPU (the datasheet
    bandwidth unless ``bandwidth_gb_s`` is given, from ``bandwidth_origin``)."""
    layout = load_layout(model)
    length = check_context(layout, context_len)
    users = check_positive_int(users, "users")
    spec = find_gpu(gpu) if gpu is not None else None
    if bandwidth_gb_s is not None:
        bandwidth = check_number(bandwidth_gb_s, "bandwidth GB/s")
        origin, note = bandwidth_origin, "peak figure given instead of the catalog's"
    elif spec is not None:
        bandwidth, origin, note = spec.bandwidth_gb_s, "datasheet", spec.source
    else:
        raise StudyError("gpu: none given (expected --gpu NAME from the catalog, or a bandwidth in GB/s)")
    factor, factor_origin, factor_note = DEFAULT_BANDWIDTH_FACTOR, "assumed", FACTOR_NOTE
    if bandwidth_factor is not None:
        factor, factor_origin, factor_note = check_number(bandwidth_factor, "bandwidth factor", 1), "given", ""
    dtypes = list(kv_dtypes) if kv_dtypes else [layout.model_dtype, "fp8"]
    weights = weights_read(layout, users, weights_bytes)
    weights_origin = "given" if weights_bytes is not None else "model folder"
    acts = activation_bytes_per_request(layout)
    assumptions = (
        Assumption("bandwidth_gb_s", bandwidth, "GB/s", origin, note),
        Assumption("bandwidth_factor", factor, "fraction of peak", factor_origin, factor_note),
        Assumption("weights_bytes", weights.total_bytes, "bytes", weights_origin, weights.total_source),
        Assumption("weights_read_bytes", weights.read_bytes, "bytes per step", "estimated", "; ".join(weights.notes)),
        Assumption("activation_bytes_per_user", acts, "bytes per step", "estimated", ACTIVATION_NOTE),
        Assumption("state_traffic", 2, "x state bytes per request", "assumed", STATE_NOTE),
        Assumption("kv_read_per_step", "context (window-capped)", "tokens per request", "assumed", KV_READ_NOTE),
    )
    steps = {d: step_bytes(layout, d, length, users, weights_bytes, skip_layers, acts) for d in dtypes}
    tpot = {d: tpot_ms(s.total_bytes, bandwidth, factor) for d, s in steps.items()}
    slopes = {d: predicted_slope_ms_per_token(layout, d, bandwidth, factor, users, skip_layers) for d in dtypes}
    dominates = {d: kv_dominates_from(layout, d, users, weights_bytes, skip_layers) for d in dtypes}
    base = next((d for d, s in steps.items() if s.resolved_dtype in SIXTEEN_BIT), None)
    fp8 = next((d for d, s in steps.items() if s.resolved_dtype.startswith("fp8")), None)
    gain = speedup_pct(tpot[base], tpot[fp8]) if base and fp8 else None
    reduction = (1 - tpot[fp8] / tpot[base]) * 100 if base and fp8 else None
    return RooflineResult(
        layout.name,
        layout.config_path,
        spec.name if spec else None,
        length,
        users,
        bandwidth,
        factor,
        steps,
        tpot,
        slopes,
        dominates,
        base,
        fp8,
        gain,
        reduction,
        weights,
        assumptions,
    )
