"""The training data of the project's small model: token ids and loss masks, made from seeds.

Byte-level ids (id = byte value, ``BOS_ID`` before every text): GSM8K-format problems packed
as a few-shot prompt lays them out, calculator-step drills, retrieval contexts followed by
questions, and echo sequences (questions or key/value lines said twice). Every builder takes a seeded
``random.Random`` and returns ``(inputs, labels)`` of one length, ``IGNORE`` where no loss
counts. :mod:`kvstudy.tools.train_model` puts them into batches.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from kvstudy.tools import gsm8k_data, retrieval_data

BOS_ID = 256
EOS_ID = 257
IGNORE = -100
STEP_RE = re.compile(r"(\d+(?: [-+*/] \d+)+) = <<([^=>]+)=(-?\d+)>>(-?\d+)")


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


def _labelled(text: str, mask: list[int], length: int) -> tuple[list[int], list[int]]:
    """BOS, then ``text`` padded with EOS, cut to ``length + 1`` tokens: inputs and labels of ``length``
    each (``IGNORE`` where ``mask``, one entry a character, is 0). The texts are ASCII: a character is a byte."""
    ids = ([BOS_ID] + encode(text) + [EOS_ID] * length)[: length + 1]
    mask = ([0] + mask + [0] * length)[: length + 1]
    return ids[:length], [t if m else IGNORE for t, m in zip(ids[1:], mask[1:])]


def _fill(pieces: Callable[[], tuple[str, list[int]]], length: int) -> tuple[list[int], list[int]]:
    """Pieces until ``length`` tokens follow BOS."""
    text, mask = "", list[int]()
    while len(mask) < length:
        piece, piece_mask = pieces()
        text, mask = text + piece, mask + piece_mask
    return _labelled(text, mask, length)


def gsm_sequence(rng: random.Random, length: int, excluded: frozenset[str]) -> tuple[list[int], list[int]]:
    """Problems packed one after another, as a few-shot prompt lays them out (``Question: q\\nAnswer:
    a\\n\\n``), the loss on ``Question:`` and the answer."""

    def piece() -> tuple[str, list[int]]:
        problem = fresh_problem(rng, excluded)
        head, body, tail = "Question:", f" {problem.question}\nAnswer:", f" {problem.answer}\n\n"
        return head + body + tail, [1] * len(head) + [0] * len(body) + [1] * len(tail)

    return _fill(piece, length)


def drill_sequence(rng: random.Random, length: int, excluded: frozenset[str]) -> tuple[list[int], list[int]]:
    """The calculator steps of fresh problems' worked answers, one per line, the loss on all after the operands."""
    queue: list[tuple[str, list[int]]] = []

    def piece() -> tuple[str, list[int]]:
        while not queue:
            for match in STEP_RE.finditer(fresh_problem(rng, excluded).answer):
                text, operands = match.group(0) + "\n", len(match.group(1))
                queue.append((text, [0] * operands + [1] * (len(text) - operands)))
        return queue.pop(0)

    return _fill(piece, length)


def arith_line(rng: random.Random) -> tuple[str, list[int]]:
    """A random calculator step of the kinds the templates' answers hold (sums and differences of
    1-3 digit numbers, products of a 1-2 digit number and a digit, exact quotients, percentages of multiples of
    20), loss on all after the operands: dense practice of the column arithmetic those need."""
    op = rng.choices("+-*/%", weights=(4, 4, 2, 1, 1))[0]

    def number() -> int:
        return rng.randint(1, 10 ** rng.randint(1, 3) - 1)

    if op == "+":
        a, b = number(), number()
        expr, value = f"{a} + {b}", a + b
    elif op == "-":
        a, b = sorted((number(), number()), reverse=True)
        expr, value = f"{a} - {b}", a - b
    elif op == "*":
        a, b = rng.randint(2, 10 ** rng.randint(1, 2) - 1), rng.randint(2, 9)
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        expr, value = f"{a} * {b}", a * b
    elif op == "/":
        b, value = rng.randint(2, 9), rng.randint(2, 60)
        expr = f"{b * value} / {b}"
    else:
        a, pct = rng.randint(1, 15) * 20, rng.choice((10, 20, 25, 50))
        expr, value = f"{a} * {pct} / 100", a * pct // 100
    text = gsm8k_data.calculator_step(expr, value) + "\n"
    return text, [0] * len(expr) + [1] * (len(text) - len(expr))


def arith_sequence(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """Random calculator steps (``arith_line``), one per line."""
    return _fill(lambda: arith_line(rng), length)


def copy_sequence(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """Key/value lines, then the same lines again shuffled: loss on all of each repeated line
    but its key's first letter (dense copy-from-context examples)."""
    context, entries = retrieval_data.kv_context(rng, length // 2 - 2)
    rng.shuffle(entries)
    text, mask = context + "\n\n", [0] * (len(context) + 2)
    for entry in entries:
        line = retrieval_data.kv_line(entry) + "\n"
        text, mask = text + line, mask + [0] + [1] * (len(line) - 1)
    return _labelled(text, mask, length)


def echo_sequence(rng: random.Random, length: int, excluded: frozenset[str]) -> tuple[list[int], list[int]]:
    """Text said twice: half the time GSM8K-format questions (``Question: q`` then ``Again: q``, loss
    on the repeat), half the time key/value lines said again (``copy_sequence``). Dense examples of
    copying from context, the mechanism both tasks need; without them it did not form here."""
    if rng.random() < 0.5:
        return copy_sequence(rng, length)

    def piece() -> tuple[str, list[int]]:
        question = fresh_problem(rng, excluded).question
        first, again = f"Question: {question}\n", f"Again: {question}\n\n"
        return first + again, [0] * (len(first) + len("Again:")) + [1] * (len(again) - len("Again:"))

    return _fill(piece, length)


def retrieval_sequence(
    rng: random.Random, length: int, questions: int, needle_share: float, copy_share: float = 0.0
) -> tuple[list[int], list[int]]:
    """A retrieval context sized so that it and its questions fill ``length`` tokens (or, a
    ``copy_share`` of the time, a ``copy_sequence``); the loss counts whole answers only (one the
    cut at ``length`` would split is masked). Each question is followed by RULER's answer prefix
    (``retrieval_data.ANSWER_PREFIXES``), as the evaluation asks it.
    """
    if copy_share and rng.random() < copy_share:
        return copy_sequence(rng, length)
    kind = "needle" if rng.random() < needle_share else "kv"
    key = "abcde"
    question = (
        f"\n\nQuestion: {retrieval_data.QUESTIONS[kind].format(key)}\nAnswer: "
        f"{retrieval_data.ANSWER_PREFIXES[kind].format(key)} 12345\n\n"
    )
    target = max(32, length - 1 - questions * len(question))
    needles = rng.randint(1, max(1, min(6, target // 64)))
    text, spans = retrieval_data.training_text(kind, target, rng, questions, n_needles=needles)
    mask = [0] * len(text)
    for start, end in spans:
        if end <= length:  # text[i] is token i + 1 after BOS; keep answers that fit whole
            mask[start:end] = [1] * (end - start)
    return _labelled(text, mask, length)
