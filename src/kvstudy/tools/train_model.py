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
  answers (and the ``Question:`` that follows one), never the random numbers a question states.
- **schedule**: stages of growing context length for the retrieval part (a curriculum), AdamW
  with warm-up and cosine decay, gradient clipping, ``torch.set_num_threads(2)``.

The output folder holds the HF files, ``training.json`` (settings, loss curve, wall time,
versions, sha256 of every file) and nothing else; ``SOURCE.md`` is written by hand from it.

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
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.tools import retrieval_data

try:
    from kvstudy.tools import gsm8k_data
except ImportError:  # the module's older home
    from kvstudy import gsm8k_data  # type: ignore[no-redef]

DEFAULT_OUT = Path("data/trained-model/qwen3-mini")
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258
IGNORE = -100
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja")
STEP_RE = re.compile(r"(\d+(?: [-+*/] \d+)+) = <<([^=>]+)=(-?\d+)>>(-?\d+)")
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


# --------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: how many steps and what each step's batch holds."""

    steps: int
    gsm_seqs: int            # sequences of packed GSM8K-format problems
    gsm_len: int             # their length in tokens
    drill_seqs: int          # sequences of calculator-step drills
    drill_len: int
    retrieval_seqs: int      # retrieval sequences (context + questions)
    retrieval_len: int
    retrieval_questions: int  # questions after each retrieval context


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
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.01
    beta2: float = 0.98
    grad_clip: float = 1.0
    threads: int = 2
    log_every: int = 10
    first_steps_logged: int = 8
    needle_share: float = 0.3  # share of retrieval sequences that are needle haystacks
    stages: tuple[Stage, ...] = (
        Stage(420, 3, 512, 6, 256, 2, 512, 8),
        Stage(130, 2, 512, 4, 256, 1, 1024, 10),
        Stage(50, 2, 512, 2, 256, 1, 2048, 12),
        Stage(10, 2, 512, 2, 256, 1, 4096, 16),
    )

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [asdict(s) for s in self.stages]
        return data


def settings_from_dict(data: dict[str, Any]) -> TrainSettings:
    """The settings ``training.json`` stores, back as a ``TrainSettings``."""
    try:
        stages = tuple(Stage(**stage) for stage in data["stages"])
        return TrainSettings(**{**data, "stages": stages})
    except (KeyError, TypeError) as exc:
        raise StudyError(f"training.json settings: {exc}; expected the fields of TrainSettings") from None


def stage_at(settings: TrainSettings, step: int) -> Stage:
    """The stage a (0-based) step belongs to."""
    end = 0
    for stage in settings.stages:
        end += stage.steps
        if step < end:
            return stage
    raise StudyError(f"step: {step} is past the last stage (total {settings.total_steps} steps)")


def learning_rate(settings: TrainSettings, step: int) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    span = max(1, settings.total_steps - settings.warmup_steps)
    progress = min(1.0, (step - settings.warmup_steps) / span)
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- data

def encode(text: str) -> list[int]:
    """Token ids of ``text`` (its UTF-8 bytes), without BOS: what the tokenizer gives after BOS."""
    return list(text.encode("utf-8"))


def test_questions() -> frozenset[str]:
    """The questions of the test split (``data/gsm8k/test.jsonl``), never trained on."""
    return frozenset(p.question for p in gsm8k_data.generate()["test"])


def fresh_problem(rng: random.Random, excluded: frozenset[str]) -> Any:
    """A GSM8K-format problem from the generator's templates that is not a test question."""
    while True:
        problem = rng.choice(gsm8k_data.TEMPLATES)(rng)
        if problem.question not in excluded:
            return problem


def problem_text(question: str, answer: str) -> tuple[str, list[int]]:
    """``Question: q\\nAnswer: a\\n\\n`` and its loss mask (``Question:`` and the answer count)."""
    head = "Question:"
    body = f" {question}\nAnswer:"
    tail = f" {answer}\n\n"
    return head + body + tail, [1] * len(head) + [0] * len(body) + [1] * len(tail)


def drill_lines(problem: Any) -> list[tuple[str, list[int]]]:
    """The calculator steps of a worked answer, one line each, loss on all after the operands."""
    lines = []
    for match in STEP_RE.finditer(problem.answer):
        text = match.group(0) + "\n"
        operands = len(match.group(1))
        lines.append((text, [0] * operands + [1] * (len(text) - operands)))
    return lines


def _fill(pieces: Callable[[], tuple[str, list[int]]], length: int) -> tuple[list[int], list[int]]:
    """BOS then pieces until ``length + 1`` tokens; inputs and labels of ``length`` each."""
    ids, mask = [BOS_ID], [0]
    while len(ids) < length + 1:
        text, piece_mask = pieces()
        ids += encode(text)
        mask += piece_mask
    ids, mask = ids[:length + 1], mask[:length + 1]
    labels = [t if m else IGNORE for t, m in zip(ids[1:], mask[1:])]
    return ids[:length], labels


def gsm_sequence(rng: random.Random, length: int, excluded: frozenset[str]
                 ) -> tuple[list[int], list[int]]:
    """Problems packed one after another, as a few-shot prompt lays them out."""
    def piece() -> tuple[str, list[int]]:
        problem = fresh_problem(rng, excluded)
        return problem_text(problem.question, problem.answer)
    return _fill(piece, length)


def drill_sequence(rng: random.Random, length: int, excluded: frozenset[str]
                   ) -> tuple[list[int], list[int]]:
    """Calculator steps of fresh problems, one per line."""
    queue: list[tuple[str, list[int]]] = []

    def piece() -> tuple[str, list[int]]:
        while not queue:
            queue.extend(drill_lines(fresh_problem(rng, excluded)))
        return queue.pop(0)
    return _fill(piece, length)


def retrieval_sequence(rng: random.Random, length: int, questions: int, needle_share: float
                       ) -> tuple[list[int], list[int]]:
    """A retrieval context sized so that it and its questions fill ``length`` tokens."""
    kind = "needle" if rng.random() < needle_share else "kv"
    per_question = 64 if kind == "needle" else 52
    target = max(32, length - 1 - questions * per_question)
    text, spans = retrieval_data.training_text(kind, target, rng, questions,
                                               n_needles=rng.randint(1, 6))
    mask = [0] * len(text)
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    ids = [BOS_ID] + encode(text)
    mask = [0] + mask
    ids, mask = ids[:length + 1], mask[:length + 1]
    pad = length + 1 - len(ids)
    ids, mask = ids + [EOS_ID] * pad, mask + [0] * pad
    labels = [t if m else IGNORE for t, m in zip(ids[1:], mask[1:])]
    return ids[:length], labels


def batch_for_step(settings: TrainSettings, step: int, excluded: frozenset[str]
                   ) -> list[tuple[str, list[list[int]], list[list[int]]]]:
    """The micro-batches of one step: ``(part, inputs, labels)``; a pure function of the step."""
    stage = stage_at(settings, step)
    parts = []
    for part, count, length in (("gsm", stage.gsm_seqs, stage.gsm_len),
                                ("drill", stage.drill_seqs, stage.drill_len),
                                ("retrieval", stage.retrieval_seqs, stage.retrieval_len)):
        inputs, labels = [], []
        for index in range(count):
            rng = random.Random(f"{settings.seed}:{part}:{step}:{index}")
            if part == "gsm":
                seq = gsm_sequence(rng, length, excluded)
            elif part == "drill":
                seq = drill_sequence(rng, length, excluded)
            else:
                seq = retrieval_sequence(rng, length, stage.retrieval_questions,
                                         settings.needle_share)
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
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
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
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, BOS_ID)])
    return tok


def hf_tokenizer(settings: TrainSettings) -> Any:
    """The tokenizer wrapped for transformers (and vLLM), with BOS/EOS and a chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(), bos_token=BOS_TOKEN, eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN, model_max_length=settings.max_position_embeddings,
        chat_template=CHAT_TEMPLATE, add_bos_token=True, clean_up_tokenization_spaces=False)


def new_model(settings: TrainSettings) -> Any:
    """The untrained model, float32, initialised from ``settings.seed``."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(settings.seed)
    config = model_config(settings)
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config)


# --------------------------------------------------------------------------- training

@dataclass
class TrainResult:
    """What a training run produced."""

    model: Any
    losses: list[float]                    # mean loss over the step's answer tokens, every step
    part_losses: list[dict[str, float]]    # the same per part (gsm, drill, retrieval)
    wall_s: float
    steps: int = 0
    seconds_per_stage: list[float] = field(default_factory=list)


def train(settings: TrainSettings, max_steps: int | None = None,
          progress: Callable[[str], None] | None = None) -> TrainResult:
    """Train from scratch; ``max_steps`` stops early (the tests run the first few steps)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(settings.threads)
    excluded = test_questions()
    model = new_model(settings)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=settings.lr, betas=(0.9, settings.beta2), eps=1e-8)
    steps = settings.total_steps if max_steps is None else min(max_steps, settings.total_steps)
    losses: list[float] = []
    part_losses: list[dict[str, float]] = []
    stage_seconds: list[float] = []
    start = stage_start = time.perf_counter()
    current_stage = stage_at(settings, 0)
    for step in range(steps):
        stage = stage_at(settings, step)
        if stage is not current_stage:
            stage_seconds.append(time.perf_counter() - stage_start)
            stage_start, current_stage = time.perf_counter(), stage
        for group in opt.param_groups:
            group["lr"] = learning_rate(settings, step)
        parts = batch_for_step(settings, step, excluded)
        counts = {part: sum(t != IGNORE for row in labels for t in row)
                  for part, _, labels in parts}
        total = sum(counts.values())
        step_loss, per_part = 0.0, {}
        for part, inputs, labels in parts:
            x = torch.tensor(inputs, dtype=torch.long)
            y = torch.tensor(labels, dtype=torch.long)
            logits = model(input_ids=x).logits
            loss_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1),
                                       ignore_index=IGNORE, reduction="sum")
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
            progress(f"step {step + 1}/{steps} loss {losses[-1]:.4f} ({parts_text}) "
                     f"lr {learning_rate(settings, step):.2e} {elapsed:.0f}s")
    stage_seconds.append(time.perf_counter() - stage_start)
    return TrainResult(model, losses, part_losses, time.perf_counter() - start, steps,
                       stage_seconds)


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
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in ("training.json", "SOURCE.md")}


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def save_model(result: TrainResult, settings: TrainSettings, out: Path) -> dict[str, Any]:
    """Write the HF folder (bfloat16 weights) and ``training.json``; return the latter's data."""
    import torch
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model = result.model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                                               pad_token_id=EOS_ID)
    model.save_pretrained(out, safe_serialization=True)
    hf_tokenizer(settings).save_pretrained(out)
    every = settings.log_every
    curve = [[i + 1, round(sum(result.losses[max(0, i + 1 - every):i + 1])
                          / len(result.losses[max(0, i + 1 - every):i + 1]), 5)]
             for i in range(every - 1, len(result.losses), every)]
    record = {
        "what": "kvstudy's trained mini Qwen3 (GSM8K-format arithmetic + long-context retrieval)",
        "settings": settings.to_dict(),
        "steps": result.steps,
        "first_losses": result.losses[:settings.first_steps_logged],
        "loss_curve": {"every": every, "points": curve,
                       "note": "[step, mean loss of the last `every` steps]"},
        "final_part_losses": result.part_losses[-1] if result.part_losses else {},
        "wall_s": round(result.wall_s, 1),
        "seconds_per_stage": [round(s, 1) for s in result.seconds_per_stage],
        "threads": settings.threads,
        "cpu": cpu_model(),
        "versions": _versions(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": folder_digests(out),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


# --------------------------------------------------------------------------- evaluation

def load_trained(folder: str | Path) -> tuple[Any, Any]:
    """The saved model (weights as stored, computed in float32) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise StudyError(f"{folder}: no config.json (expected a model folder written by train-model)")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    return model, tok


def greedy_complete(model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int,
                    stop: Sequence[str], batch_size: int = 16) -> list[str]:
    """Greedy continuations of ``prompts``, each cut at the first stop string (or EOS).

    A plain loop over the KV cache with left padding: one forward pass per new token for the
    whole batch, stopping as soon as every row has hit a stop string.
    """
    import torch

    tok.padding_side = "left"
    tail = max(len(s) for s in stop) + 4
    outputs: list[str] = []
    for begin in range(0, len(prompts), batch_size):
        enc = tok(list(prompts[begin:begin + batch_size]), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        rows = ids.shape[0]
        generated: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        past = None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                            past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1)
                for row in range(rows):
                    if done[row]:
                        continue
                    token = int(nxt[row])
                    if token == EOS_ID:
                        done[row] = True
                        continue
                    generated[row].append(token)
                    recent = tok.decode(generated[row][-tail:], skip_special_tokens=True)
                    done[row] = any(s in recent for s in stop)
                if all(done):
                    break
                ids = nxt[:, None]
                positions = positions[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype)], dim=1)
        for row in range(rows):
            text = tok.decode(generated[row], skip_special_tokens=True)
            cut = min([text.index(s) for s in stop if s in text], default=len(text))
            outputs.append(text[:cut])
    return outputs


def strict_match(completion: str) -> str | None:
    """The number after the first ``#### `` (lm-eval's strict-match), normalised like its metric."""
    match = STRICT_RE.search(completion)
    if not match:
        return None
    return match.group(1).replace(",", "").replace("$", "").rstrip(".")


def gsm8k_prompt(question: str, shots: Sequence[Any]) -> str:
    """lm-eval's gsm8k layout: shots as ``Question: q\\nAnswer: a`` joined by blank lines."""
    head = "".join(f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in shots)
    return f"{head}Question: {question}\nAnswer:"


def evaluate_gsm8k(folder: str | Path, n: int, shots: int = 0,
                   test_file: str | Path = "data/gsm8k/test.jsonl",
                   train_file: str | Path = "data/gsm8k/train.jsonl",
                   batch_size: int = 16) -> dict[str, Any]:
    """Greedy strict-match accuracy on the first ``n`` test questions, ``shots``-shot.

    Shots come from the train file, drawn per question with ``random.Random(1234 + index)``.
    """
    test = gsm8k_data.read_split(test_file)[:n]
    pool = gsm8k_data.read_split(train_file) if shots else []
    model, tok = load_trained(folder)
    prompts = [gsm8k_prompt(p.question, random.Random(1234 + i).sample(pool, shots) if shots else [])
               for i, p in enumerate(test)]
    completions = greedy_complete(model, tok, prompts, 320, ["Question:"], batch_size)
    answers = [strict_match(c) for c in completions]
    gold = [gsm8k_data.final_answer(p.answer) for p in test]
    correct = [a == g for a, g in zip(answers, gold)]
    return {"n": len(test), "shots": shots, "correct": sum(correct),
            "accuracy": sum(correct) / max(1, len(test)),
            "samples": [{"doc_id": i, "gold": g, "answer": a, "completion": c}
                        for i, (g, a, c) in enumerate(zip(gold, answers, completions))]}


def evaluate_retrieval(folder: str | Path, lengths: Sequence[int], n: int,
                       kinds: Sequence[str] = retrieval_data.KINDS,
                       seed: int = retrieval_data.DEFAULT_SEED, batch_size: int = 4
                       ) -> dict[str, Any]:
    """Greedy accuracy per kind and context length on ``n`` generated items each."""
    model, tok = load_trained(folder)
    results: dict[str, Any] = {}
    for kind in kinds:
        for length in lengths:
            items = retrieval_data.generate_items(kind, [length], n, seed=seed)
            prompts = [retrieval_data.prompt_text(item) for item in items]
            completions = greedy_complete(model, tok, prompts, 8, ["\n"], batch_size)
            correct = [retrieval_data.answer_of(c) == item["answer"]
                       for c, item in zip(completions, items)]
            results[f"{kind}@{length}"] = {
                "kind": kind, "length": length, "n": len(items), "correct": sum(correct),
                "accuracy": sum(correct) / len(items),
                "context_tokens": sum(len(tok(p)["input_ids"]) for p in prompts) / len(prompts)}
    return results


# --------------------------------------------------------------------------- command line

def run_training(out: str | Path, settings: TrainSettings = TrainSettings(),
                 progress: Callable[[str], None] | None = print) -> dict[str, Any]:
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
        settings = replace(settings, stages=tuple(
            replace(s, steps=max(1, round(s.steps * args.steps_scale))) for s in settings.stages))
    record = run_training(args.out, settings)
    print(f"{args.out}: trained in {record['wall_s']:.0f} s, final loss "
          f"{record['loss_curve']['points'][-1][1]:.4f}")
    if args.eval:
        gsm = evaluate_gsm8k(args.out, args.eval)
        print(f"gsm8k zero-shot strict-match: {gsm['correct']}/{gsm['n']} = {gsm['accuracy']:.3f}")
        ret = evaluate_retrieval(args.out, (512, 1024, 2048, 4096), 20)
        for key, value in ret.items():
            print(f"retrieval {key}: {value['correct']}/{value['n']}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy train-model --out DIR``."""
    parser = subparsers.add_parser("train-model",
                                   help="train the small Qwen3 model (GSM8K-format + retrieval)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"model folder (default {DEFAULT_OUT})")
    parser.add_argument("--eval", type=int, default=0, metavar="N",
                        help="then evaluate on N test questions and 20 retrieval items per length")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply every stage's steps (1.0 = the committed recipe)")
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
