"""Simulated FP8 KV storage where the engine refuses it: the model in PyTorch, K and V rounded as vLLM stores them.

vLLM's FP8 KV cache writes ``clamp(x / scale, -max, max)`` as ``float8_e4m3fn`` (or ``e5m2``) and
multiplies by ``scale`` again when attention reads it (``scaled_fp8_conversion`` saturates; it
never writes NaN). A 16-bit cache stores ``x`` rounded to ``bfloat16``. :func:`store` does the same
in PyTorch, element by element, so quantizing on write and quantizing on read give the same
numbers; a transformers model computes attention over the result through :func:`attention`, a
function registered in transformers' attention registry (``ATTENTION_NAME``). This is **simulated
storage (PyTorch), not vLLM's kernels**: same rounding, other arithmetic.

Two groups (the model itself, and the positive control of ``kvstudy.tools.checkpoints``
whose K is ``control_factor`` times larger), each with a 16-bit baseline, an A/A floor (16-bit
again through the written-out attention, so only the order of sums differs) and candidates (FP8
e4m3 at scale 1.0, with calibrated or the checkpoint's scales, e5m2, int8 per token and head). Every
arm scores the same prompts teacher-forced and, with ``greedy_n``, answers GSM8K-format items
greedily. Everything it writes says so.

torch is imported inside the functions: the analysis environment (no torch) imports this module's
constants only.

    kvstudy kv-simulate CAPTURE [--model DIR] [--gsm8k-n 100] [--retrieval-lengths 512 1024 2048 4096]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from pydantic import Field, model_validator

from kvstudy.bench.logprobs import Group, ScoredPrompt, gsm8k_prompts
from kvstudy.bench.spec import Axis, Spec
from kvstudy.capture import (
    create_or_resume,
    finish_session,
    model_inputs,
    needs_run,
    set_items,
    start_session,
    write_manifest,
)
from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import write_json_atomic, write_jsonl_atomic
from kvstudy.limits import Factor, Items, Seed, Threads, Tokens
from kvstudy.precision import records as rc
from kvstudy.tools import checkpoints as ctl

MAIN, CONTROL = "qwen3-mini", "positive-control"

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


class SimSpec(Spec):
    """What a simulated-storage capture runs (the notebook's parameters have these names)."""

    model: str = Field("data/trained-model/qwen3-mini", description="the model folder run in PyTorch")
    control_dir: str = Field(
        "captures/models/qwen3-mini-k2048", description="where the positive-control checkpoint is written"
    )
    control_factor: Factor = Field(ctl.FACTOR, description="k_norm is multiplied and q_norm divided by this")
    gsm8k_n: Items = Field(100, description="GSM8K-format problems scored teacher-forced")
    control_gsm8k_n: Items = Field(50, description="problems the positive control scores")
    retrieval_lengths: Axis[Tokens] = [512, 1024, 2048, 4096]
    retrieval_per_length: Items = 8
    retrieval_seed: Seed = 20261130
    calibration_gsm8k_n: Items = 16
    calibration_seed: Seed = 20261201
    greedy_n: Items = Field(0, description="GSM8K-format items answered greedily per arm")
    greedy_max_tokens: Tokens = 320
    threads: Threads = 2

    @model_validator(mode="after")
    def _scored(self) -> Self:
        if not self.gsm8k_n and not self.retrieval_per_length:
            raise ValueError("gsm8k_n and retrieval_per_length are both 0: nothing to score")
        if self.greedy_n > self.gsm8k_n:
            raise ValueError(
                f"greedy_n {self.greedy_n}: expected <= gsm8k_n {self.gsm8k_n} (a subset of the scored items)"
            )
        return self


@dataclass
class Loaded:
    model: Any
    tok: Any
    layers: int


def load(folder: str | Path, threads: int) -> Loaded:
    """The model in float32 compute (weights as stored) with the storage-simulating attention."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MissingPrerequisite("torch and transformers are not installed here", "make engine") from None
    if not (Path(folder) / "config.json").is_file():
        raise StudyError(f"{folder}: no config.json (expected a Hugging Face model folder)")
    torch.set_num_threads(threads)
    name = register()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=name)
    model.eval()
    return Loaded(model, tok, int(model.config.num_hidden_layers))


def _ids(tok: Any, prompt: ScoredPrompt) -> tuple[list[int], int]:
    """Token ids of prompt + continuation, and where the continuation starts."""
    head = list(tok(prompt.prompt)["input_ids"])
    full = list(tok(prompt.prompt + prompt.continuation)["input_ids"])
    start = len(head)
    if full[:start] != head:  # a merge across the boundary: start where the two agree no longer
        start = next(i for i, (a, b) in enumerate(zip(head, full)) if a != b)
    if start >= len(full):
        raise StudyError(f"prompt {prompt.id}: the continuation has no tokens of its own")
    return full, start


def score(loaded: Loaded, prompts: Sequence[ScoredPrompt], storage: Storage) -> list[dict[str, Any]]:
    """Teacher-forced log p and top-1 token of every reference token, one prompt at a time."""
    import torch

    limit = int(getattr(loaded.model.config, "max_position_embeddings", 0) or 0)
    STATE.storage = storage
    rows = []
    try:
        with torch.no_grad():
            for prompt in prompts:
                ids, start = _ids(loaded.tok, prompt)
                if limit and len(ids) > limit:
                    raise StudyError(f"prompt {prompt.id}: {len(ids)} tokens, the model's limit is {limit}")
                logits = loaded.model(input_ids=torch.tensor([ids])).logits[0, start - 1 : len(ids) - 1].float()
                logp = torch.log_softmax(logits, dim=-1)
                target = torch.tensor(ids[start:])
                rows.append(
                    {
                        "id": prompt.id,
                        "bucket": prompt.bucket,
                        "cluster": prompt.cluster,
                        "prompt_tokens": start,
                        "logp": [float(v) for v in logp.gather(1, target[:, None])[:, 0]],
                        "top1": [int(v) for v in logits.argmax(-1)],
                    }
                )
    finally:
        STATE.storage = None
    return rows


def greedy(loaded: Loaded, prompts: Sequence[ScoredPrompt], storage: Storage, max_tokens: int) -> list[dict[str, Any]]:
    """Greedy answers to GSM8K-format prompts (strict match of ``#### N``)."""
    from kvstudy.tools.train_model import greedy_complete, strict_match

    STATE.storage = storage
    try:
        texts = greedy_complete(loaded.model, loaded.tok, [p.prompt for p in prompts], max_tokens, ["Question:"], 8)
    finally:
        STATE.storage = None
    answers = [strict_match(text) for text in texts]
    return [
        {"id": p.id, "gold": p.gold, "answer": a, "correct": a == p.gold, "completion": text}
        for p, a, text in zip(prompts, answers, texts)
    ]


def calibrate(loaded: Loaded, prompts: Sequence[ScoredPrompt]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """e4m3 scales (max |x| / 448 per layer) observed over ``prompts`` with 16-bit storage."""
    STATE.amax.clear()
    STATE.observe = True
    try:
        score(loaded, prompts, Storage("calibration", "bfloat16"))
    finally:
        STATE.observe = False
    k, v = calibrated_scales(STATE.amax, loaded.layers, "float8_e4m3fn")
    return k, v


# every group's first arms: the baseline, its A/A floor, FP8 at scale 1.0
FIRST_ARMS = [
    Storage("bf16", "bfloat16"),
    Storage("bf16-repeat", "bfloat16", kernel="eager"),
    Storage("fp8-e4m3-scale1", "float8_e4m3fn"),
]


LABELS = {
    "bf16": "16-bit (bfloat16) storage",
    "bf16-repeat": "16-bit again, written-out attention (A/A)",
    "fp8-e4m3-scale1": "FP8 e4m3, scale 1.0",
    "fp8-e4m3-calibrated": "FP8 e4m3, calibrated scales",
    "fp8-e5m2-scale1": "FP8 e5m2, scale 1.0",
    "int8-token-head": "int8 per token and head",
    "fp8-e4m3-checkpoint": "FP8 e4m3, checkpoint's scales",
}
GREEDY_ARMS = ("bf16", "bf16-repeat", "fp8-e4m3-scale1", "fp8-e4m3-calibrated", "fp8-e4m3-checkpoint")


def arm_state(capture: Path, group: str, arm: str, states: dict[str, str]) -> str | None:
    """What the done rule (``capture.needs_run``) reads for one arm: its recorded state, but no
    result (None) for an "ok" whose log-p file is missing."""
    state = states.get(f"{group}/{arm}")
    return None if state == "ok" and not rc.logp_path(capture, group, arm).is_file() else state


def run(spec: SimSpec, capture: str | Path, force: bool = False, retry_failed: bool = False) -> Path:
    """Make (or resume) a simulated-storage capture in ``capture`` (a folder kv-simulate did not
    write only with ``force``: ``records.claim_capture``). An arm done (``ok``) is kept; one that
    failed runs again only with ``retry_failed`` (``capture.needs_run``, every experiment's rule)."""
    capture = rc.claim_capture(capture, "kv-simulate", [MAIN, CONTROL], force)
    record = ctl.ensure_control(spec.model, spec.control_dir, spec.control_factor)
    inputs = {**model_inputs(spec.model), "control_weights_sha256": record["weights_sha256"]}
    grid = {**spec.model_dump(exclude={"threads"}), "groups": [MAIN, CONTROL], "storage": LABEL}
    manifest, _ = create_or_resume(
        capture,
        rc.KIND,
        grid,
        "kvstudy kv-simulate (transformers, simulated KV storage)",
        inputs,
        lambda g, w: g,
    )
    states: dict[str, str] = dict(manifest.get("items") or {})
    session = start_session(manifest, [MAIN, CONTROL])
    write_manifest(capture, manifest)
    scored = rc.scored_prompts(spec.gsm8k_n, spec.retrieval_lengths, spec.retrieval_per_length, spec.retrieval_seed)
    calib_prompts = rc.scored_prompts(
        spec.calibration_gsm8k_n,
        spec.retrieval_lengths[:2],
        1,
        spec.calibration_seed,
        split=rc.GSM8K_TRAIN,
        prefix="calib-gsm8k",
    )

    def run_group(
        name: str, model_dir: str, loaded: Loaded, storages: list[Storage], prompts: list[ScoredPrompt], note: str
    ) -> None:
        arms = {s.name: {**asdict(s), "label": LABELS.get(s.name, s.name)} for s in storages}
        candidates = tuple(s.name for s in storages[2:])
        group = Group(name, LABEL, model_dir, storages[0].name, storages[1].name, candidates, arms, (note,))
        write_json_atomic(capture / name / rc.GROUP_FILE, asdict(group))
        gsm = [p for p in prompts if p.bucket == "gsm8k"][: spec.greedy_n]
        for storage in storages:
            key = f"{name}/{storage.name}"
            state = arm_state(capture, name, storage.name, states)
            if not needs_run(state, retry_failed):
                if state == "failed":
                    print(f"kv-simulate: {key} failed before, kept; run again with --retry-failed", flush=True)
                continue
            began = time.monotonic()
            try:
                write_jsonl_atomic(rc.logp_path(capture, name, storage.name), score(loaded, prompts, storage))
                greedy_file = rc.greedy_path(capture, name, storage.name)
                if gsm and storage.name in GREEDY_ARMS and not greedy_file.is_file():
                    write_jsonl_atomic(greedy_file, greedy(loaded, gsm, storage, spec.greedy_max_tokens))
            except Exception:
                states[key] = "failed"  # recorded by the finally below; the error still stops the run
                raise
            states[key] = "ok"
            print(f"kv-simulate: {key} done in {time.monotonic() - began:.0f} s", flush=True)

    try:
        loaded = load(spec.model, spec.threads)
        calib = calibrate(loaded, calib_prompts)
        write_json_atomic(
            capture / MAIN / "calibration.json",
            {"k_scales": calib[0], "v_scales": calib[1], "prompts": [p.id for p in calib_prompts]},
        )
        main_arms = [
            *FIRST_ARMS,
            Storage("fp8-e4m3-calibrated", "float8_e4m3fn", *calib, scales_from="calibration"),
            Storage("fp8-e5m2-scale1", "float8_e5m2"),
            Storage("int8-token-head", "int8_per_token_head", scales_from="per token and head"),
        ]
        run_group(
            MAIN,
            spec.model,
            loaded,
            main_arms,
            scored,
            f"calibration on {len(calib_prompts)} prompts that are not scored (GSM8K train split, "
            f"retrieval seed {spec.calibration_seed})",
        )
        control = load(spec.control_dir, spec.threads)
        k, v, found = checkpoint_scales(spec.control_dir, control.layers)
        write_json_atomic(capture / CONTROL / "control.json", {**record, "source": spec.model, "scales_found": found})
        checkpoint = Storage("fp8-e4m3-checkpoint", "float8_e4m3fn", k, v, scales_from="checkpoint")
        run_group(
            CONTROL,
            spec.control_dir,
            control,
            [*FIRST_ARMS, checkpoint],
            gsm8k_prompts(spec.control_gsm8k_n),
            f"k_norm x {spec.control_factor:g}, q_norm / {spec.control_factor:g}; checkpoint: {found}",
        )
    finally:
        set_items(manifest, states)
        finish_session(session)
        write_manifest(capture, manifest)
    return capture
