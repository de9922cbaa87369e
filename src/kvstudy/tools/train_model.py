"""Train the project's small Qwen3 model: GSM8K-format arithmetic and long-context retrieval.

The CPU profile needs a model whose answers depend on what it computes, so that a difference
between a 16-bit and an FP8 KV cache can show. Random weights answer nothing; this module
trains one, offline and deterministically, in minutes on two CPU cores:

- **architecture**: ``Qwen3ForCausalLM`` (what vLLM serves), a few layers, GQA (fewer KV heads
  than query heads), RoPE with a large base so retrieval reaches 4k+ positions,
  ``max_position_embeddings`` 8192, tied embeddings; saved as bfloat16 safetensors.
- **tokenizer**: byte level with no merges (one token per byte, plus ``<|startoftext|>`` added
  before every text and ``<|endoftext|>``), so every digit is its own token and arithmetic is
  learnable; a ``tokenizer.json`` that ``AutoTokenizer`` and vLLM load.
- **data**, made fresh for every step from a string-seeded ``random.Random`` (step ``i`` never
  depends on the steps before it, so a test can rebuild any step):
  GSM8K-format problems from :mod:`kvstudy.tools.gsm8k_data`'s templates, drawn with other
  seeds than its test split, with every question of the test split dropped; calculator drills
  (the ``a * b = <<a*b=c>>c`` steps of such problems, one per line); and retrieval contexts from
  :mod:`kvstudy.tools.retrieval_data` followed by several questions. The loss counts only
  answers (and, in retrieval, the queried key's letters after its first, which only copying
  from the context predicts), never the random numbers a question states.
- **schedule**: stages of growing retrieval context (a curriculum: many short contexts with few
  keys first, where copying from context forms fast, then up to 2048 tokens), AdamW with warm-up
  and cosine decay, gradient clipping; an optional phase B (``finetune_stages``) from the bf16
  rounded weights. ``torch.set_num_threads`` is a setting (1 on two shared cores). Evaluation
  (greedy, transformers) lives in :mod:`kvstudy.tools.train_eval`.

The output folder holds the HF files and ``training.json`` (settings, loss curve, wall time,
versions, sha256 of every file); ``SOURCE.md`` is written by hand from it.

    python -m kvstudy.tools.train_model --out data/trained-model/qwen3-mini
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.machine import cpu_model
from kvstudy.tools.train_data import (  # noqa: F401
    BOS_ID,
    EOS_ID,
    IGNORE,
    STEP_RE,
    copy_sequence,
    drill_lines,
    drill_sequence,
    echo_sequence,
    encode,
    fresh_problem,
    gsm_sequence,
    problem_text,
    retrieval_sequence,
    test_questions,
)
from kvstudy.tools.train_eval import evaluate_gsm8k, evaluate_retrieval, greedy_complete, load_trained, strict_match  # noqa: F401

DEFAULT_OUT = Path("data/trained-model/qwen3-mini")
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 258
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: how many steps and what each step's batch holds."""

    steps: int
    gsm_seqs: int  # sequences of packed GSM8K-format problems
    gsm_len: int  # their length in tokens
    drill_seqs: int  # sequences of calculator-step drills
    drill_len: int
    retrieval_seqs: int  # retrieval sequences (context + questions)
    retrieval_len: int
    retrieval_questions: int  # questions after each retrieval context
    echo_seqs: int = 0  # sequences of text said twice (train_data.echo_sequence)
    echo_len: int = 0


@dataclass(frozen=True)
class TrainSettings:
    """The whole recipe; ``training.json`` stores it, and the same settings give the same model."""

    seed: int = 20261130
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 200000.0
    max_position_embeddings: int = 8192
    # 3e-3 (the first recipes) never formed copying from context in a 2-layer probe on text said
    # twice; 1e-3 did within 1,000 steps and 5e-4 within 500 (the probe in the SOURCE.md)
    lr: float = 8e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    beta2: float = 0.98
    grad_clip: float = 1.0
    threads: int = 2  # the two cores of the build machine, nothing else running
    log_every: int = 10
    first_steps_logged: int = 8
    needle_share: float = 0.3  # share of retrieval sequences that are needle haystacks
    copy_share: float = 0.0  # share of retrieval sequences that are key/value lines said twice
    # Qwen3 normalises queries and keys (RMSNorm, weight 1 at init), which caps attention logits
    # at sqrt(head_dim); a larger initial norm weight may let sharp (copying) attention form early.
    qk_norm_init: float = 1.0
    # the data's format: 3 = retrieval questions followed by RULER's answer prefix (the only one
    # this code builds; 1 and 2 were earlier recipes' data, without it)
    data_version: int = 3
    stages: tuple[Stage, ...] = (
        Stage(400, 4, 384, 4, 128, 4, 256, 4, echo_seqs=6, echo_len=256),
        Stage(500, 4, 512, 2, 128, 2, 512, 8, echo_seqs=2, echo_len=512),
        Stage(200, 2, 512, 2, 128, 1, 1536, 12, echo_seqs=1, echo_len=1024),
    )
    # Phase B starts from phase A's weights rounded to bfloat16 (as saved), with a fresh AdamW and
    # its own warm-up and cosine: retrieval over longer contexts (kv and needles alike) and GSM8K-format
    # problems packed as long as an 8-shot prompt. No finetune stages = no phase B.
    finetune_lr: float = 4e-4
    finetune_warmup_steps: int = 20
    finetune_needle_share: float = 0.5
    finetune_stages: tuple[Stage, ...] = (
        Stage(300, 2, 512, 1, 128, 2, 1024, 8, echo_seqs=2, echo_len=512),
        Stage(150, 1, 2048, 1, 128, 1, 2048, 12, echo_seqs=1, echo_len=1024),
        Stage(50, 1, 2560, 1, 128, 1, 4096, 16),
    )

    @property
    def total_steps(self) -> int:
        """Steps of phase A."""
        return sum(s.steps for s in self.stages)

    def phase_stages(self, phase: int) -> tuple[Stage, ...]:
        """The stages of phase 0 (A) or 1 (B)."""
        return self.stages if phase == 0 else self.finetune_stages

    def phase_steps(self, phase: int) -> int:
        """How many steps phase 0 (A) or 1 (B) has."""
        return sum(s.steps for s in self.phase_stages(phase))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [asdict(s) for s in self.stages]
        data["finetune_stages"] = [asdict(s) for s in self.finetune_stages]
        return data


def settings_from_dict(data: dict[str, Any]) -> TrainSettings:
    """The settings ``training.json`` stores, back as a ``TrainSettings``."""
    try:
        stages = tuple(Stage(**stage) for stage in data["stages"])
        finetune = tuple(Stage(**stage) for stage in data.get("finetune_stages", []))
        # a record older than a field was made with the behaviour before it
        legacy = {"data_version": 1, "copy_share": 0.0, "qk_norm_init": 1.0}
        settings = TrainSettings(**{**legacy, **data, "stages": stages, "finetune_stages": finetune})
    except (KeyError, TypeError) as exc:
        raise StudyError(f"training.json settings: {exc}; expected the fields of TrainSettings") from None
    if settings.data_version != TrainSettings.data_version:
        raise StudyError(
            f"training.json settings: data_version {settings.data_version} is an earlier recipe's data "
            f"(retrieval questions without RULER's answer prefix); this code builds version {TrainSettings.data_version} only"
        )
    return settings


def stage_at(settings: TrainSettings, step: int, phase: int = 0) -> Stage:
    """The stage a (0-based) step of a phase belongs to."""
    end = 0
    for stage in settings.phase_stages(phase):
        end += stage.steps
        if step < end:
            return stage
    raise StudyError(f"step: {step} is past the last stage of phase {phase} ({settings.phase_steps(phase)} steps)")


def learning_rate(settings: TrainSettings, step: int, phase: int = 0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the phase's peak."""
    peak = settings.lr if phase == 0 else settings.finetune_lr
    warmup = settings.warmup_steps if phase == 0 else settings.finetune_warmup_steps
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, settings.phase_steps(phase) - warmup)
    progress = min(1.0, (step - warmup) / span)
    floor = settings.min_lr_ratio
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- data


def batch_for_step(
    settings: TrainSettings, step: int, excluded: frozenset[str], phase: int = 0
) -> list[tuple[str, list[list[int]], list[list[int]]]]:
    """The micro-batches of one step: ``(part, inputs, labels)``; a pure function of the step."""
    stage = stage_at(settings, step, phase)
    prefix = f"{settings.seed}" if phase == 0 else f"{settings.seed}:finetune"
    needle_share = settings.needle_share if phase == 0 else settings.finetune_needle_share
    parts = []
    for part, count, length in (
        ("gsm", stage.gsm_seqs, stage.gsm_len),
        ("drill", stage.drill_seqs, stage.drill_len),
        ("retrieval", stage.retrieval_seqs, stage.retrieval_len),
        ("echo", stage.echo_seqs, stage.echo_len),
    ):
        inputs, labels = [], []
        for index in range(count):
            rng = random.Random(f"{prefix}:{part}:{step}:{index}")
            if part == "gsm":
                seq = gsm_sequence(rng, length, excluded)
            elif part == "drill":
                seq = drill_sequence(rng, length, excluded)
            elif part == "echo":
                seq = echo_sequence(rng, length, excluded)
            else:
                seq = retrieval_sequence(rng, length, stage.retrieval_questions, needle_share, settings.copy_share)
            inputs.append(seq[0])
            labels.append(seq[1])
        if inputs:
            parts.append((part, inputs, labels))
    return parts


# --------------------------------------------------------------------------- model and tokenizer


def model_config(settings: TrainSettings) -> Any:
    """The ``Qwen3Config`` of the recipe."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=settings.num_attention_heads,
        num_key_value_heads=settings.num_key_value_heads,
        head_dim=settings.head_dim,
        max_position_embeddings=settings.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": settings.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )


def _byte_symbols() -> list[str]:
    """The printable character that stands for each byte in a byte-level vocabulary, by byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_tokenizer() -> Any:
    """A byte-level tokenizer without merges: id = byte value, then BOS 256 and EOS 257."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}
    vocab[BOS_TOKEN], vocab[EOS_TOKEN] = BOS_ID, EOS_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([BOS_TOKEN, EOS_TOKEN])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    return tok


def hf_tokenizer(settings: TrainSettings) -> Any:
    """The tokenizer wrapped for transformers (and vLLM), with BOS/EOS and a chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=settings.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
        add_bos_token=True,
        clean_up_tokenization_spaces=False,
    )


def new_model(settings: TrainSettings) -> Any:
    """The untrained model, float32, initialised from ``settings.seed``."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(settings.seed)
    config = model_config(settings)
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(settings.qk_norm_init)
            layer.self_attn.k_norm.weight.fill_(settings.qk_norm_init)
    return model


# --------------------------------------------------------------------------- training


@dataclass
class PhaseResult:
    """What one phase of training produced."""

    phase: int
    steps: int
    first_losses: list[float]  # mean loss over answer tokens, the first steps
    curve: list[list[float]]  # [step within the phase, mean loss of the last steps]
    final_part_losses: dict[str, float]  # the last step's loss per part (gsm, drill, retrieval)
    wall_s: float
    seconds_per_stage: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # every step's loss


@dataclass
class TrainResult:
    """A trained model and its phases."""

    model: Any
    phases: list[PhaseResult]

    @property
    def losses(self) -> list[float]:
        return [loss for phase in self.phases for loss in phase.losses]


def train_phase(
    model: Any,
    settings: TrainSettings,
    phase: int,
    max_steps: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> PhaseResult:
    """Run one phase on ``model`` (float32) with a fresh AdamW; the model is trained in place."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(settings.threads)
    excluded = test_questions()
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, settings.beta2),
        eps=1e-8,
    )
    total_steps = settings.phase_steps(phase)
    steps = total_steps if max_steps is None else min(max_steps, total_steps)
    losses: list[float] = []
    part_losses: list[dict[str, float]] = []
    stage_seconds: list[float] = []
    start = stage_start = time.perf_counter()
    current_stage = stage_at(settings, 0, phase)
    for step in range(steps):
        stage = stage_at(settings, step, phase)
        if stage is not current_stage:
            stage_seconds.append(time.perf_counter() - stage_start)
            stage_start, current_stage = time.perf_counter(), stage
        for group in opt.param_groups:
            group["lr"] = learning_rate(settings, step, phase)
        parts = batch_for_step(settings, step, excluded, phase)
        counts = {part: sum(t != IGNORE for row in labels for t in row) for part, _, labels in parts}
        total = sum(counts.values())
        step_loss, per_part = 0.0, {}
        for part, inputs, labels in parts:
            x = torch.tensor(inputs, dtype=torch.long)
            y = torch.tensor(labels, dtype=torch.long)
            logits = model(input_ids=x).logits
            loss_sum = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum"
            )
            (loss_sum / total).backward()
            step_loss += loss_sum.item()
            per_part[part] = loss_sum.item() / max(1, counts[part])
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss / total)
        part_losses.append(per_part)
        if progress and (step % settings.log_every == 0 or step == steps - 1):
            elapsed = time.perf_counter() - start
            parts_text = " ".join(f"{k} {v:.3f}" for k, v in per_part.items())
            progress(
                f"phase {'AB'[phase]} step {step + 1}/{steps} loss {losses[-1]:.4f} "
                f"({parts_text}) lr {learning_rate(settings, step, phase):.2e} {elapsed:.0f}s"
            )
    stage_seconds.append(time.perf_counter() - stage_start)
    every = settings.log_every
    curve = [
        [i + 1, round(sum(losses[i + 1 - every : i + 1]) / every, 5)] for i in range(every - 1, len(losses), every)
    ]
    return PhaseResult(
        phase,
        steps,
        losses[: settings.first_steps_logged],
        curve,
        part_losses[-1] if part_losses else {},
        time.perf_counter() - start,
        stage_seconds,
        losses,
    )


def round_to_bfloat16(model: Any) -> Any:
    """The model's weights rounded to bfloat16 and back to float32 (what saving then loading does)."""
    import torch

    return model.to(torch.bfloat16).to(torch.float32)


def train(
    settings: TrainSettings, max_steps: int | None = None, progress: Callable[[str], None] | None = None
) -> TrainResult:
    """Train from scratch: phase A, round to bfloat16, phase B.

    ``max_steps`` runs only the first steps of phase A (the tests use it).
    """
    model = new_model(settings)
    first = train_phase(model, settings, 0, max_steps, progress)
    if max_steps is not None:
        return TrainResult(model, [first])
    if not settings.finetune_stages:
        return TrainResult(model, [first])
    model = round_to_bfloat16(model)
    second = train_phase(model, settings, 1, None, progress)
    return TrainResult(model, [first, second])


# --------------------------------------------------------------------------- saving


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file the model folder holds, except ``training.json`` and ``SOURCE.md``."""
    return {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in ("training.json", "SOURCE.md")
    }


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def save_model(result: TrainResult, settings: TrainSettings, out: Path) -> dict[str, Any]:
    """Write the HF folder (bfloat16 weights) and ``training.json``; return the latter's data."""
    import torch
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model = result.model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    model.save_pretrained(out, safe_serialization=True)
    hf_tokenizer(settings).save_pretrained(out)
    offset, curve = 0, []
    for phase in result.phases:
        curve += [[offset + step, loss] for step, loss in phase.curve]
        offset += phase.steps
    record = {
        "what": "kvstudy's trained mini Qwen3 (GSM8K-format arithmetic + long-context retrieval)",
        "settings": settings.to_dict(),
        "steps": [phase.steps for phase in result.phases],
        "first_losses": result.phases[0].first_losses,
        "loss_curve": {
            "every": settings.log_every,
            "points": curve,
            "note": "[step counted over both phases, mean loss of the last `every` "
            "steps]; phase B starts after phase A's steps",
        },
        "final_part_losses": [phase.final_part_losses for phase in result.phases],
        "wall_s": round(sum(phase.wall_s for phase in result.phases), 1),
        "seconds_per_stage": [[round(x, 1) for x in phase.seconds_per_stage] for phase in result.phases],
        "threads": settings.threads,
        "cpu": cpu_model(),
        "versions": _versions(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": folder_digests(out),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


# --------------------------------------------------------------------------- command line


def run_training(
    out: str | Path, settings: TrainSettings = TrainSettings(), progress: Callable[[str], None] | None = print
) -> dict[str, Any]:
    """Train with ``settings`` and save the folder at ``out``; return ``training.json``'s data."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StudyError(f"{out}: exists and is not a folder (expected the model folder to write)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = train(settings, progress=progress)
    return save_model(result, settings, out)


def _cmd_train(args: argparse.Namespace) -> int:
    settings = TrainSettings()
    if args.steps_scale != 1.0:
        from dataclasses import replace

        def scaled(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
            return tuple(replace(s, steps=max(1, round(s.steps * args.steps_scale))) for s in stages)

        settings = replace(settings, stages=scaled(settings.stages), finetune_stages=scaled(settings.finetune_stages))
    record = run_training(args.out, settings)
    print(f"{args.out}: trained in {record['wall_s']:.0f} s, final loss {record['loss_curve']['points'][-1][1]:.4f}")
    if args.eval:
        gsm = evaluate_gsm8k(args.out, args.eval)
        print(f"gsm8k zero-shot strict-match: {gsm['correct']}/{gsm['n']} = {gsm['accuracy']:.3f}")
        ret = evaluate_retrieval(args.out, (512, 1024, 2048, 4096), 20)
        for key, value in ret.items():
            print(f"retrieval {key}: {value['correct']}/{value['n']}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy train-model --out DIR``."""
    parser = subparsers.add_parser("train-model", help="train the small Qwen3 model (GSM8K-format + retrieval)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"model folder (default {DEFAULT_OUT})")
    parser.add_argument(
        "--eval",
        type=int,
        default=0,
        metavar="N",
        help="then evaluate on N test questions and 20 retrieval items per length",
    )
    parser.add_argument(
        "--steps-scale", type=float, default=1.0, help="multiply every stage's steps (1.0 = the committed recipe)"
    )
    parser.set_defaults(func=_cmd_train)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvstudy.tools.train_model --out DIR`` (same as ``kvstudy train-model``)."""
    parser = argparse.ArgumentParser(prog="python -m kvstudy.tools.train_model")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["train-model", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except StudyError as exc:
        print(f"kvstudy: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
