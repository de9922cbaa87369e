"""Evaluate the project's trained small model: greedy GSM8K-format strict-match and retrieval.

Plain transformers (float32 compute on the stored weights), no server: what
:mod:`kvstudy.tools.train_model` reports after training and what ``SOURCE.md`` quotes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.tools import gsm8k_data, retrieval_data
from kvstudy.tools.train_data import EOS_ID

STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def load_trained(folder: str | Path) -> tuple[Any, Any]:
    """The saved model (weights as stored, computed in float32) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise StudyError(f"{folder}: no config.json (expected a model folder written by train-model)")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    return model, tok


def greedy_complete(
    model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int, stop: Sequence[str], batch_size: int = 16
) -> list[str]:
    """Greedy continuations of ``prompts``, each cut at the first stop string (or EOS). A plain loop over the KV
    cache with left padding: one forward pass per new token for the whole batch, stopping as soon as every row has
    hit a stop string."""
    import torch

    tok.padding_side = "left"
    tail = max(len(s) for s in stop) + 4
    outputs: list[str] = []
    for begin in range(0, len(prompts), batch_size):
        enc = tok(list(prompts[begin : begin + batch_size]), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        rows = ids.shape[0]
        generated: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        past = None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True
                )
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
    test = gsm8k_data.read_split(test_file)[:n]
    pool = gsm8k_data.read_split(train_file) if shots else []
    model, tok = load_trained(folder)
    prompts = []  # lm-eval's gsm8k layout: shots as ``Question: q\nAnswer: a`` joined by blank lines
    for i, p in enumerate(test):
        head = "".join(
            f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in random.Random(1234 + i).sample(pool, shots)
        )
        prompts.append(f"{head}Question: {p.question}\nAnswer:")
    completions = greedy_complete(model, tok, prompts, 320, ["Question:"], batch_size)
    answers = [strict_match(c) for c in completions]
    gold = [gsm8k_data.final_answer(p.answer) for p in test]
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
