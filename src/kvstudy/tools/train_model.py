"""Train the project's small Qwen3 model (GSM8K-format arithmetic and long-context retrieval),
offline and deterministically, on CPU: random weights answer nothing, and the CPU profile needs a
model whose answers depend on what it computes, so that a 16-bit and an FP8 KV cache can differ.

A byte-level tokenizer without merges (every digit its own token, so arithmetic is learnable); data
made fresh for every step from a string-seeded ``random.Random`` (any step can be rebuilt), the loss
counting only answers; the recipe's phases and stages (both :mod:`kvstudy.tools.train_data`). The
output folder holds the HF files and ``training.json`` (settings, loss curve, wall time, versions,
sha256 of every file); ``SOURCE.md`` is written by hand from it. The evaluation (below: greedy
GSM8K-format strict-match and retrieval) is plain transformers, float32 compute on the stored
weights, no server: what ``train-model --eval`` reports and ``SOURCE.md`` quotes.

    kvstudy train-model --out data/trained-model/qwen3-mini
"""

from __future__ import annotations

import os
import platform
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from kvstudy.errors import StudyError
from kvstudy.io import read_json_object, write_json_atomic
from kvstudy.machine import cpu_model, package_versions
from kvstudy.outputs import check_output_folder, claim_output_folder, record_says
from kvstudy.tools import retrieval_data, train_data
from kvstudy.tools.tiny_model import BOS_TOKEN, EOS_TOKEN, SHAPE_FIELDS, folder_digests, new_qwen3, save_folder
from kvstudy.tools.train_data import BOS_ID, EOS_ID, IGNORE, TrainSettings, first_error, learning_rate, stage_at

DEFAULT_OUT = Path("data/trained-model/qwen3-mini")


def batch_for_step(
    settings: TrainSettings, step: int, excluded: frozenset[str], phase: int = 0
) -> list[tuple[str, list[list[int]], list[list[int]]]]:
    """The micro-batches of one step: ``(part, inputs, labels)``; a pure function of the step."""
    stage = stage_at(settings, step, phase)
    tag, needle_share = settings.phases[phase].seed_tag, settings.phases[phase].needle_share
    prefix = f"{settings.seed}:{tag}" if tag else f"{settings.seed}"
    makers = {
        "gsm": lambda rng, n: train_data.gsm_sequence(rng, n, excluded),
        "drill": lambda rng, n: train_data.drill_sequence(rng, n, excluded),
        "arith": train_data.arith_sequence,
        "echo": lambda rng, n: train_data.echo_sequence(rng, n, excluded),
        "retrieval": lambda rng, n: train_data.retrieval_sequence(
            rng, n, stage.retrieval_questions, needle_share, settings.copy_share
        ),
    }
    parts = []
    for part, count, length in stage.part_shapes():
        seqs = [makers[part](random.Random(f"{prefix}:{part}:{step}:{index}"), length) for index in range(count)]
        if seqs:
            parts.append((part, [seq[0] for seq in seqs], [seq[1] for seq in seqs]))
    return parts


# --------------------------------------------------------------------------- model and tokenizer


def build_tokenizer() -> Any:
    """A byte-level tokenizer without merges: id = byte value, then BOS 256 and EOS 257."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # the byte-level alphabet, by byte

    vocab = {symbol: byte for byte, symbol in bytes_to_unicode().items()}
    vocab[BOS_TOKEN], vocab[EOS_TOKEN] = BOS_ID, EOS_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([BOS_TOKEN, EOS_TOKEN])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    return tok


def new_model(settings: TrainSettings) -> Any:
    """The untrained model, float32, initialised from ``settings.seed``."""
    import torch

    model = new_qwen3(
        settings, build_tokenizer(), rope_parameters={"rope_type": "default", "rope_theta": settings.rope_theta}
    )
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(settings.qk_norm_init)
            layer.self_attn.k_norm.weight.fill_(settings.qk_norm_init)
    return model


# --------------------------------------------------------------------------- training


@dataclass
class PhaseResult:
    """What one phase of training produced."""

    steps: int
    losses: list[float]  # every step's mean loss over answer tokens
    curve: list[list[float]]  # [step within the phase, mean loss of the last steps]
    final_part_losses: dict[str, float]  # the last step's loss per part (gsm, drill, retrieval)
    wall_s: float
    seconds_per_stage: list[float]


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
    excluded = train_data.test_questions()
    model.train()
    current = settings.phases[phase]
    groups = [[p for p in model.parameters() if (p.dim() >= 2) == decay] for decay in (True, False)]
    opt = torch.optim.AdamW(
        [{"params": groups[0], "weight_decay": settings.weight_decay}, {"params": groups[1], "weight_decay": 0.0}],
        lr=current.lr,
        betas=(0.9, settings.beta2),
        eps=1e-8,
    )
    steps = current.steps if max_steps is None else min(max_steps, current.steps)
    losses: list[float] = []
    per_part: dict[str, float] = {}  # the last step's loss per part
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
        if progress and (step % settings.log_every == 0 or step == steps - 1):
            elapsed = time.perf_counter() - start
            parts_text = " ".join(f"{k} {v:.3f}" for k, v in per_part.items())
            progress(
                f"phase {current.name} step {step + 1}/{steps} loss {losses[-1]:.4f} "
                f"({parts_text}) lr {learning_rate(settings, step, phase):.2e} {elapsed:.0f}s"
            )
    stage_seconds.append(time.perf_counter() - stage_start)
    every = settings.log_every
    curve = [
        [i + 1, round(sum(losses[i + 1 - every : i + 1]) / every, 5)] for i in range(every - 1, len(losses), every)
    ]
    return PhaseResult(steps, losses, curve, per_part, time.perf_counter() - start, stage_seconds)


def round_to_bfloat16(model: Any) -> Any:
    """The model's weights rounded to bfloat16 and back to float32: what saving then loading does. Parameters only:
    casting the whole module would also round RoPE's ``inv_freq`` buffers, which a saved model does not store and
    recomputes in float32 when it is loaded (vLLM too)."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))
    return model


def train(
    settings: TrainSettings, max_steps: int | None = None, progress: Callable[[str], None] | None = None
) -> tuple[Any, list[PhaseResult]]:
    """Train from scratch: the first phase, then each later one from the weights rounded to bfloat16;
    the model and its phases. ``max_steps`` runs only the first steps of the first phase (the tests use it)."""
    model = new_model(settings)
    phases = [train_phase(model, settings, 0, max_steps, progress)]
    for index in range(1, len(settings.phases) if max_steps is None else 1):
        model = round_to_bfloat16(model)
        phases.append(train_phase(model, settings, index, None, progress))
    return model, phases


def save_model(
    model: Any, phases: list[PhaseResult], settings: TrainSettings, out: Path, earlier: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write the HF folder (bfloat16 weights) and ``training.json``; return the latter's data. ``earlier``: the
    record of the folder the ``phases`` continued; its phases come first, ``continued_from`` says which state."""
    claim_output_folder(out, "train-model", force=True, recognise=_trained_before)  # checked before training
    save_folder(model, build_tokenizer(), out, add_bos_token=True, clean_up_tokenization_spaces=False)
    before = earlier or {"steps": [], "loss_curve": {"points": []}, "final_part_losses": [], "seconds_per_stage": []}
    offset, curve = sum(before["steps"]), list(before["loss_curve"]["points"])
    for phase in phases:
        curve += [[offset + step, loss] for step, loss in phase.curve]
        offset += phase.steps
    record = {
        "what": "kvstudy's trained mini Qwen3 (GSM8K-format arithmetic + long-context retrieval)",
        "settings": asdict(settings),
        "steps": before["steps"] + [phase.steps for phase in phases],
        "first_losses": before.get("first_losses") or phases[0].losses[: settings.first_steps_logged],
        "loss_curve": {
            "every": settings.log_every,
            "points": curve,
            "note": "[step counted over all phases, mean loss of the last `every` "
            "steps]; each phase starts after the steps of the phases before it",
        },
        "final_part_losses": before["final_part_losses"] + [phase.final_part_losses for phase in phases],
        "wall_s": round(before.get("wall_s", 0) + sum(phase.wall_s for phase in phases), 1),
        "seconds_per_stage": before["seconds_per_stage"]
        + [[round(x, 1) for x in phase.seconds_per_stage] for phase in phases],
        "threads": settings.threads,
        "cpu": cpu_model(),
        "versions": {"python": platform.python_version(), **package_versions(("torch", "transformers", "tokenizers"))},
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": folder_digests(out),
    }
    if earlier:
        kept = {key: earlier.get(key) for key in ("created_utc", "files", "continued_from")}
        record["continued_from"] = {"phases": len(earlier["steps"]), **kept}
    write_json_atomic(out / "training.json", record)
    return record


# --------------------------------------------------------------------------- continuing an earlier folder


def earlier_record(folder: str | Path, settings: TrainSettings) -> dict[str, Any]:
    """``training.json`` of a model folder that ``settings``' later phases may continue: its recipe is
    ``settings`` with only the first phases, its record holds what the new one carries on, its files
    are plain files matching their recorded digests, and its ``config.json`` is the recipe's model;
    else one line naming what was tampered with or is missing."""
    folder = Path(folder)
    path = folder / "training.json"
    if not path.is_file():
        raise StudyError(f"{folder}: no training.json (expected a model folder saved by train-model, to continue)")
    links = sorted(p.name for p in folder.iterdir() if p.is_symlink())
    if links:
        raise StudyError(f"{folder / links[0]}: a symbolic link; expected the file train-model saved, to continue")
    record = read_json_object(path)
    earlier = train_data.settings_from_dict(record.get("settings", {}))
    done = len(earlier.phases)
    same = earlier.phases == settings.phases[:done] and replace(earlier, phases=settings.phases) == settings
    if not same or done >= len(settings.phases):
        raise StudyError(
            f"{path}: its recipe is not this one's first {done} phase(s) "
            f"(expected a folder trained with the first phases of TrainSettings, to continue it)"
        )
    try:
        checked = _Record.model_validate(record)
    except ValidationError as exc:
        raise StudyError(f"{path}: {first_error(exc)} (the record train-model wrote)") from None
    steps = [p.steps for p in earlier.phases]
    if checked.steps != steps:
        raise StudyError(f"{path}: steps is {checked.steps!r:.80}, expected {steps} (the recipe's phases)")
    for key in ("final_part_losses", "seconds_per_stage"):
        if len(getattr(checked, key)) != len(steps):
            raise StudyError(
                f"{path}: {key} has {len(getattr(checked, key))} entries, expected {len(steps)} (one a phase)"
            )
    # the folder's files are the ones training.json lists, with the same digests
    found = folder_digests(folder)
    for name in sorted(set(checked.files) | set(found)):
        if name not in found:
            why = f"missing ({path.name} lists it)"
        elif name not in checked.files:
            why = f"not among the files {path.name} lists"
        elif found[name] != checked.files[name]:
            why = f"its content differs from the digest in {path.name} (changed since it was saved)"
        else:
            continue
        raise StudyError(f"{folder / name}: {why}; expected the saved model, to continue")
    # config.json describes the recipe's model (a folder whose digests were rewritten with it)
    saved, config = read_json_object(folder / "config.json"), new_model(settings).config.to_dict()
    for key in ("model_type", "vocab_size", *SHAPE_FIELDS, "tie_word_embeddings"):
        if saved.get(key) != config.get(key):
            raise StudyError(
                f"{folder / 'config.json'}: {key} is {str(saved.get(key))[:40]}, expected {config.get(key)} "
                "(the recipe's model)"
            )
    return record


Pair = Annotated[list[FiniteFloat], Field(min_length=2, max_length=2)]  # [step, loss]


class _Curve(BaseModel):
    points: list[Pair]


class _Record(BaseModel):
    """The fields of an earlier ``training.json`` that :func:`save_model` carries on, as it wrote them."""

    model_config = ConfigDict(strict=True)  # other fields are kept, not read

    steps: list[int]
    loss_curve: _Curve
    final_part_losses: list[dict[str, FiniteFloat]]
    seconds_per_stage: list[list[FiniteFloat]]
    first_losses: list[FiniteFloat]
    wall_s: FiniteFloat = 0.0
    files: dict[str, str]


_trained_before = record_says("training.json", "what", lambda what: str(what).startswith("kvstudy's trained"))


def run_training(
    out: str | Path,
    settings: TrainSettings = TrainSettings(),
    progress: Callable[[str], None] | None = print,
    start: str | Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Train with ``settings`` and save the folder at ``out`` (``outputs.check_output_folder``, before any training);
    ``training.json``'s data. ``start``: a folder saved after the recipe's first phases; only the later phases run."""
    out = check_output_folder(out, "train-model", force, recognise=_trained_before)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if start is None:
        return save_model(*train(settings, progress=progress), settings, out)
    earlier = earlier_record(start, settings)
    model, _ = load_trained(start)  # float32: exactly the bfloat16 rounding ``train`` does between phases
    phases = [
        train_phase(model, settings, i, None, progress) for i in range(len(earlier["steps"]), len(settings.phases))
    ]
    return save_model(model, phases, settings, out, earlier)


# --------------------------------------------------------------------------- evaluation

STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def load_trained(folder: str | Path) -> tuple[Any, Any]:
    """The saved model (weights as stored, computed in float32) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise StudyError(f"{folder}: no config.json (expected a model folder written by train-model)")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        tok = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # transformers and safetensors raise many kinds for a bad folder
        raise StudyError(
            f"{folder}: cannot be loaded as the saved model ({type(exc).__name__}: {str(exc)[:160]})"
        ) from None
    return model.eval(), tok


def greedy_complete(
    model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int, stop: Sequence[str], batch_size: int = 16
) -> list[str]:
    """Greedy continuations of ``prompts`` (transformers' ``generate`` on left-padded batches, a batch ending when
    every row has hit a stop string or EOS), each cut at its first stop string."""
    import torch

    tok.padding_side = "left"
    outputs: list[str] = []
    for begin in range(0, len(prompts), batch_size):
        enc = tok(list(prompts[begin : begin + batch_size]), return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                do_sample=False,
                max_new_tokens=max_new_tokens,
                stop_strings=list(stop),
                tokenizer=tok,
                eos_token_id=EOS_ID,
                pad_token_id=EOS_ID,
            )
        for text in tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True):
            outputs.append(text[: min([text.index(s) for s in stop if s in text], default=len(text))])
    return outputs


def strict_match(completion: str) -> str | None:
    """The number after the first ``#### `` (lm-eval's strict-match), normalised like its metric."""
    match = STRICT_RE.search(completion)
    return match.group(1).replace(",", "").replace("$", "").rstrip(".") if match else None


def evaluate_gsm8k(
    folder: str | Path,
    n: int,
    shots: int = 0,
    test_file: str | Path = "data/gsm8k/test.jsonl",
    train_file: str | Path = "data/gsm8k/train.jsonl",
    batch_size: int = 16,
) -> dict[str, Any]:
    """Greedy strict-match accuracy on the first ``n`` test questions, ``shots``-shot. Shots come from the train
    file, drawn per question with ``random.Random(1234 + index)``."""
    test = train_data.read_split(test_file)[:n]
    pool = train_data.read_split(train_file) if shots else []
    model, tok = load_trained(folder)
    prompts = []  # lm-eval's gsm8k layout: shots as ``Question: q\nAnswer: a`` joined by blank lines
    for i, p in enumerate(test):
        head = "".join(
            f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in random.Random(1234 + i).sample(pool, shots)
        )
        prompts.append(f"{head}Question: {p.question}\nAnswer:")
    completions = greedy_complete(model, tok, prompts, 320, ["Question:"], batch_size)
    answers = [strict_match(c) for c in completions]
    gold = [train_data.final_answer(p.answer) for p in test]
    correct = [a == g for a, g in zip(answers, gold)]
    return {
        "n": len(test),
        "shots": shots,
        "correct": sum(correct),
        "accuracy": sum(correct) / max(1, len(test)),
        "samples": [
            {"doc_id": i, "gold": g, "answer": a, "completion": c}
            for i, (g, a, c) in enumerate(zip(gold, answers, completions))
        ],
    }


def evaluate_retrieval(
    folder: str | Path,
    lengths: Sequence[int],
    n: int,
    kinds: Sequence[str] = retrieval_data.KINDS,
    seed: int = retrieval_data.DEFAULT_SEED,
    batch_size: int = 4,
) -> dict[str, Any]:
    """Greedy accuracy per kind and context length on ``n`` generated items each."""
    model, tok = load_trained(folder)
    results: dict[str, Any] = {}
    for kind in kinds:
        for length in lengths:
            items = retrieval_data.generate_items(kind, [length], n, seed=seed)
            prompts = [retrieval_data.prompt_text(item) for item in items]
            completions = greedy_complete(model, tok, prompts, 8, ["\n"], batch_size)
            correct = [retrieval_data.answer_of(c) == item["answer"] for c, item in zip(completions, items)]
            results[f"{kind}@{length}"] = {
                "kind": kind,
                "length": length,
                "n": len(items),
                "correct": sum(correct),
                "accuracy": sum(correct) / len(items),
                "context_tokens": sum(len(tok(p)["input_ids"]) for p in prompts) / len(prompts),
            }
    return results
