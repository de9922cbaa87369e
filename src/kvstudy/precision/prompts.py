"""The fixed prompts both the screen and the simulator score: a prompt and its reference continuation.

- GSM8K-format: ``Question: {q}\\nAnswer:`` (lm-eval's gsm8k prompt, zero-shot) continued by
  ``" " + worked solution`` (the reference answer of ``data/gsm8k/test.jsonl``); bucket ``gsm8k``.
- Retrieval: ``retrieval_data.prompt_text(item)`` continued by ``" " + value``, one question per
  context (so every prompt is its own cluster), ``n_per_length`` items per kind and length;
  bucket ``retrieval <length>``.

Calibration prompts (for scales computed from data) come from other items: the GSM8K train
split and retrieval contexts of another seed, never the scored ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvstudy.bench.logprobs import ScoredPrompt
from kvstudy.tools import gsm8k_data, retrieval_data

GSM8K_TEST = "data/gsm8k/test.jsonl"
GSM8K_TRAIN = "data/gsm8k/train.jsonl"


def bucket_length(bucket: str) -> int | None:
    """The context length of a retrieval bucket (None for other buckets)."""
    head, _, tail = bucket.partition(" ")
    return int(tail) if head == "retrieval" and tail.isdigit() else None


def gsm8k_prompts(n: int, path: str | Path = GSM8K_TEST, prefix: str = "gsm8k") -> list[ScoredPrompt]:
    """The first ``n`` GSM8K-format problems with their worked solutions as continuations."""
    problems = gsm8k_data.read_split(path)[:n] if n else []
    return [
        ScoredPrompt(
            id=f"{prefix}-{i}",
            bucket="gsm8k",
            cluster=f"{prefix}-{i}",
            prompt=f"Question: {p.question}\nAnswer:",
            continuation=" " + p.answer,
            gold=gsm8k_data.final_answer(p.answer),
        )
        for i, p in enumerate(problems)
    ]


def retrieval_prompts(
    lengths: Sequence[int], n_per_length: int, seed: int = retrieval_data.DEFAULT_SEED, chars_per_token: float = 1.0
) -> list[ScoredPrompt]:
    """``n_per_length`` items per length, half key/value and half needle (one question per context)."""
    out: list[ScoredPrompt] = []
    if not n_per_length:
        return out
    per_kind = {"kv": (n_per_length + 1) // 2, "needle": n_per_length // 2}
    for length in lengths:
        for kind, count in per_kind.items():
            if not count:
                continue
            items = retrieval_data.generate_items(
                kind, [length], count, seed=seed, chars_per_token=chars_per_token, questions_per_context=1
            )
            out += [
                ScoredPrompt(
                    id=f"{item['id']}-s{seed}",
                    bucket=f"retrieval {length}",
                    cluster=item["context_id"] + f"-s{seed}",
                    prompt=retrieval_data.prompt_text(item),
                    continuation=" " + item["answer"],
                    gold=item["answer"],
                )
                for item in items
            ]
    return out
