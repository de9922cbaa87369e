"""The GSM8K-format problems (:data:`GSM8K_DATA_DOC`), and the trained model's recipe and the training
data it makes: token ids and loss masks, from seeds.

A recipe (architecture, optimiser and the phases of its curriculum) is a frozen ``TrainSettings``;
``training.json`` stores it (``dataclasses.asdict``) and ``settings_from_dict`` reads it back, so the
same record always rebuilds the same batches. Training runs the phases in order: the first from a
seeded initialisation, each later one from the weights before it rounded to bfloat16 (as saved), with
a fresh AdamW and its own warm-up and cosine decay.

The data: byte-level ids (id = byte value, ``BOS_ID`` before every text): GSM8K-format problems
packed as a few-shot prompt lays them out, calculator-step drills, retrieval contexts followed by
questions, and echo sequences (questions or key/value lines said twice). Every builder takes a seeded
``random.Random`` and returns ``(inputs, labels)`` of one length, ``IGNORE`` where no loss counts.
:mod:`kvstudy.tools.train_model` puts them into batches and runs the phases.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Container
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from kvstudy.errors import StudyError
from kvstudy.io import read_jsonl, write_jsonl_atomic
from kvstudy.outputs import claim_output_folder
from kvstudy.tools import retrieval_data

# ``kvstudy gsm8k-data``'s description
GSM8K_DATA_DOC = """A deterministic generator of GSM8K-format arithmetic word problems (not GSM8K itself).

The GSM8K test set cannot be downloaded on a machine without the hub, so the offline task reads
problems this module writes: each item is ``{"question", "answer"}`` where ``answer`` is a worked
solution, one step per line with GSM8K's calculator marks ``<<a*b=c>>``, ending ``#### N``.
That is the format lm-eval's gsm8k prompt, filters and metric expect. The problems are
multi-step grade-school arithmetic from a fixed set of templates; every number is drawn from a
``random.Random`` with a fixed seed, so the same seed always writes the same bytes.

    kvstudy gsm8k-data data/gsm8k          # writes train.jsonl and test.jsonl
"""

SEED = 20261023
N_TEST = 1000
N_TRAIN = 200

NAMES = tuple(
    "Ava Ben Chloe Diego Emma Farid Grace Hiro Isla Jamal Kira Liam Maya Noah Olga Priya Quinn Rosa Sami Tara".split()
)
ITEMS = tuple("apples pencils stickers marbles cookies books shells stamps cards beads".split())


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # worked solution ending "#### N"


def calculator_step(expr: str, value: int) -> str:
    """``a * b = <<a*b=c>>c``: a step of a worked answer with GSM8K's calculator mark."""
    return f"{expr} = <<{expr.replace(' ', '')}={value}>>{value}"


def _finish(question: str, result: int, *steps: str) -> Problem:
    return Problem(question, "\n".join(steps) + f"\n#### {result}")


def _buy_and_change(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    count, price = r.randint(3, 12), r.randint(2, 9)
    cost = count * price
    paid = (cost // 10 + r.randint(1, 5)) * 10
    change = paid - cost
    return _finish(
        f"{name} buys {count} {item} at ${price} each and pays with ${paid}. "
        f"How many dollars of change does {name} get back?",
        change,
        f"The {item} cost {calculator_step(f'{count} * {price}', cost)} dollars.",
        f"{name} gets back {calculator_step(f'{paid} - {cost}', change)} dollars.",
    )


def _share_equally(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    friends, each, kept = r.randint(2, 8), r.randint(3, 15), r.randint(1, 20)
    total = friends * each + kept
    shared = total - kept
    return _finish(
        f"{name} has {total} {item}. {name} keeps {kept} and shares the rest equally among "
        f"{friends} friends. How many {item} does each friend get?",
        each,
        f"{name} shares {calculator_step(f'{total} - {kept}', shared)} {item}.",
        f"Each friend gets {calculator_step(f'{shared} / {friends}', each)} {item}.",
    )


def _weekly_savings(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    per_day, days, weeks = r.randint(2, 12), r.randint(3, 7), r.randint(2, 6)
    week = per_day * days
    total = week * weeks
    spent = r.randint(1, min(30, total - 1))
    left = total - spent
    return _finish(
        f"{name} saves ${per_day} a day for {days} days each week. After {weeks} weeks, "
        f"{name} spends ${spent} on a gift. How many dollars does {name} have left?",
        left,
        f"Each week {name} saves {calculator_step(f'{per_day} * {days}', week)} dollars.",
        f"In {weeks} weeks that is {calculator_step(f'{week} * {weeks}', total)} dollars.",
        f"After the gift {name} has {calculator_step(f'{total} - {spent}', left)} dollars.",
    )


def _boxes_and_extras(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    boxes, per_box = r.randint(2, 9), r.randint(4, 24)
    loose, lost = r.randint(1, 15), r.randint(1, 10)
    in_boxes = boxes * per_box
    total = in_boxes + loose
    left = total - lost
    return _finish(
        f"{name} has {boxes} boxes with {per_box} {item} in each box and {loose} loose {item}. "
        f"{name} loses {lost} of them. How many {item} does {name} have now?",
        left,
        f"The boxes hold {calculator_step(f'{boxes} * {per_box}', in_boxes)} {item}.",
        f"With the loose ones that is {calculator_step(f'{in_boxes} + {loose}', total)}.",
        f"After losing some, {name} has {calculator_step(f'{total} - {lost}', left)}.",
    )


def _twice_as_many(r: random.Random) -> Problem:
    a, b = r.sample(NAMES, 2)
    item = r.choice(ITEMS)
    first, factor, extra = r.randint(3, 40), r.randint(2, 5), r.randint(1, 12)
    second = first * factor + extra
    total = first + second
    times = first * factor
    return _finish(
        f"{a} has {first} {item}. {b} has {extra} more than {factor} times as many as {a}. "
        f"How many {item} do they have together?",
        total,
        f"{factor} times {a}'s {item} is {calculator_step(f'{first} * {factor}', times)}.",
        f"{b} has {calculator_step(f'{times} + {extra}', second)} {item}.",
        f"Together they have {calculator_step(f'{first} + {second}', total)} {item}.",
    )


def _speed_distance(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    speed, hours, back = r.randint(20, 80), r.randint(2, 6), r.randint(1, 3)
    out = speed * hours
    back_km = speed * back
    total = out + back_km
    return _finish(
        f"{name} drives at {speed} km per hour for {hours} hours, then drives back at the same "
        f"speed for {back} hours. How many kilometers does {name} drive in all?",
        total,
        f"First {name} drives {calculator_step(f'{speed} * {hours}', out)} km.",
        f"Then {name} drives {calculator_step(f'{speed} * {back}', back_km)} km.",
        f"In all that is {calculator_step(f'{out} + {back_km}', total)} km.",
    )


def _percent_discount(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    price = r.randint(1, 15) * 20  # a multiple of 20, so every discount below is whole dollars
    pct = r.choice((10, 20, 25, 50))
    off = price * pct // 100
    final = price - off
    return _finish(
        f"A set of {item} costs ${price}. {name} gets a {pct}% discount. How many dollars does {name} pay?",
        final,
        f"The discount is {calculator_step(f'{price} * {pct} / 100', off)} dollars.",
        f"{name} pays {calculator_step(f'{price} - {off}', final)} dollars.",
    )


def _pages_per_day(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    first_days, first_rate = r.randint(2, 6), r.randint(5, 20)
    rest_rate, rest_days = r.randint(10, 30), r.randint(1, 5)
    first = first_days * first_rate
    rest = rest_days * rest_rate
    total = first + rest
    return _finish(
        f"{name} reads {first_rate} pages a day for {first_days} days, then {rest_rate} pages a "
        f"day for {rest_days} days and finishes the book. How many pages does the book have?",
        total,
        f"First {name} reads {calculator_step(f'{first_days} * {first_rate}', first)} pages.",
        f"Then {name} reads {calculator_step(f'{rest_days} * {rest_rate}', rest)} pages.",
        f"The book has {calculator_step(f'{first} + {rest}', total)} pages.",
    )


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _buy_and_change,
    _share_equally,
    _weekly_savings,
    _boxes_and_extras,
    _twice_as_many,
    _speed_distance,
    _percent_discount,
    _pages_per_day,
)


def generate(n_test: int = N_TEST, n_train: int = N_TRAIN, seed: int = SEED) -> dict[str, list[Problem]]:
    """Train and test splits with no question in both; the same seed gives the same problems."""
    if n_test <= 0 or n_train < 8:
        raise StudyError(f"gsm8k-data: need n_test > 0 and n_train >= 8 (for 8 shots), got {n_test} and {n_train}")
    r = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {"test": [], "train": []}
    for split, size in (("test", n_test), ("train", n_train)):
        while len(splits[split]) < size:
            splits[split].append(fresh_problem(r, seen))
            seen.add(splits[split][-1].question)
    return splits


def fresh_problem(rng: random.Random, excluded: Container[str]) -> Problem:
    """A problem from the templates whose question is not in ``excluded`` (the test questions, when training)."""
    while True:
        problem = rng.choice(TEMPLATES)(rng)
        if problem.question not in excluded:
            return problem


def final_answer(answer: str) -> str:
    """The number after ``#### `` in a worked solution."""
    if "#### " not in answer:
        raise StudyError(f"gsm8k answer: expected a solution ending '#### N', got {answer[-40:]!r}")
    return answer.rsplit("#### ", 1)[1].strip()


def write_splits(
    folder: str | Path, seed: int = SEED, n_test: int = N_TEST, n_train: int = N_TRAIN, force: bool = False
) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` (JSON lines) into ``folder`` (``outputs.claim_output_folder``)."""
    splits = generate(n_test, n_train, seed)  # settings checked before the folder is touched
    folder = claim_output_folder(folder, "gsm8k-data", force)
    paths = {split: folder / f"{split}.jsonl" for split in splits}
    for split, problems in splits.items():
        write_jsonl_atomic(paths[split], problems)  # each as its fields
    return paths


def read_split(path: str | Path) -> list[Problem]:
    """Read a GSM8K-format JSONL file, checking every line's fields."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: no such file (generate it with kvstudy gsm8k-data)")

    def make(item: Any) -> Problem:
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("question", "answer")):
            raise ValueError("expected {'question': str, 'answer': str}")
        final_answer(item["answer"])
        return Problem(item["question"], item["answer"])

    return read_jsonl(path, make, "a GSM8K problem")


BOS_ID = 256
EOS_ID = 257
IGNORE = -100
STEP_RE = re.compile(r"(\d+(?: [-+*/] \d+)+) = <<([^=>]+)=(-?\d+)>>(-?\d+)")


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (its UTF-8 bytes), without BOS: what the tokenizer gives after BOS."""
    return list(text.encode("utf-8"))


def test_questions() -> frozenset[str]:
    """The questions of the test split (``data/gsm8k/test.jsonl``), never trained on."""
    return frozenset(p.question for p in generate()["test"])


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
    text = calculator_step(expr, value) + "\n"
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
    (``retrieval_data.ANSWER_PREFIXES``), as the evaluation asks it."""
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


STRICT = ConfigDict(strict=True, extra="forbid")


@dataclass(frozen=True)
class Stage:
    """One stage of a phase: how many steps and what each step's batch holds."""

    __pydantic_config__ = STRICT

    steps: int
    gsm_seqs: int  # sequences of packed GSM8K-format problems
    gsm_len: int  # their length in tokens
    drill_seqs: int  # sequences of calculator steps taken from fresh problems
    drill_len: int
    retrieval_seqs: int  # retrieval sequences (context + questions)
    retrieval_len: int
    retrieval_questions: int  # questions after each retrieval context
    echo_seqs: int = 0  # sequences of text said twice (train_data.echo_sequence)
    echo_len: int = 0
    arith_seqs: int = 0  # sequences of random calculator steps (train_data.arith_sequence)
    arith_len: int = 0

    def part_shapes(self) -> tuple[tuple[str, int, int], ...]:
        """``(part, sequences, length)`` of each part of a step's batch, in batch order."""
        parts = ("gsm", "drill", "arith", "retrieval", "echo")
        return tuple((p, getattr(self, f"{p}_seqs"), getattr(self, f"{p}_len")) for p in parts)


@dataclass(frozen=True)
class Phase:
    """One phase: its optimiser schedule, its data mix and its stages."""

    __pydantic_config__ = STRICT

    name: str
    seed_tag: str  # the data's seed is ``f"{seed}:{seed_tag}"`` (``f"{seed}"`` when empty)
    lr: float
    warmup_steps: int
    needle_share: float  # share of retrieval sequences that are needle haystacks
    stages: tuple[Stage, ...]

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)


# the stages of the recipe's phases (``TrainSettings.phases``). A: from scratch
STAGES_A = (
    Stage(400, 4, 384, 4, 128, 4, 256, 4, echo_seqs=6, echo_len=256),
    Stage(500, 4, 512, 2, 128, 2, 512, 8, echo_seqs=2, echo_len=512),
    Stage(200, 2, 512, 2, 128, 1, 1536, 12, echo_seqs=1, echo_len=1024),
)
# B: retrieval over longer contexts, GSM8K-format problems packed as long as an 8-shot prompt
STAGES_B = (
    Stage(300, 2, 512, 1, 128, 2, 1024, 8, echo_seqs=2, echo_len=512),
    Stage(150, 1, 2048, 1, 128, 1, 2048, 12, echo_seqs=1, echo_len=1024),
    Stage(50, 1, 2560, 1, 128, 1, 4096, 16),
)
# C: column arithmetic (after B, additions and subtractions were wrong in most failed problems
# while products were mostly right), and more retrieval at 4k tokens
STAGES_C = (
    Stage(400, 2, 512, 1, 128, 1, 1024, 8, echo_seqs=1, echo_len=512, arith_seqs=12, arith_len=128),
    Stage(150, 1, 1024, 1, 128, 1, 4096, 16, arith_seqs=8, arith_len=128),
)


@dataclass(frozen=True)
class TrainSettings:
    """The whole recipe; ``training.json`` stores it, and the same settings give the same model."""

    __pydantic_config__ = STRICT

    seed: int = 20261130
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 200000.0
    max_position_embeddings: int = 8192
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    beta2: float = 0.98
    grad_clip: float = 1.0
    threads: int = 2  # the two cores of the build machine, nothing else running
    log_every: int = 10
    first_steps_logged: int = 8
    copy_share: float = 0.0  # share of retrieval sequences that are key/value lines said twice
    # Qwen3 normalises queries and keys (RMSNorm, weight 1 at init), which caps attention logits
    # at sqrt(head_dim); a larger initial norm weight may let sharp (copying) attention form early.
    qk_norm_init: float = 1.0
    # the data's format: 3 = retrieval questions followed by RULER's answer prefix (the only one
    # this code builds; 1 and 2 were earlier recipes' data, without it)
    data_version: int = 3
    phases: tuple[Phase, ...] = (
        # A: from scratch. 3e-3 (the first recipes) never formed copying from context in a 2-layer
        # probe on text said twice; 1e-3 did within 1,000 steps and 5e-4 within 500 (SOURCE.md).
        Phase("A", "", 8e-4, 50, 0.3, STAGES_A),
        Phase("B", "finetune", 4e-4, 20, 0.5, STAGES_B),
        Phase("C", "arith", 4e-4, 20, 0.5, STAGES_C),
    )

    def scaled(self, factor: float) -> TrainSettings:
        """The same recipe with every stage's steps multiplied by ``factor`` (at least 1 each)."""
        return replace(
            self,
            phases=tuple(
                replace(p, stages=tuple(replace(s, steps=max(1, round(s.steps * factor))) for s in p.stages))
                for p in self.phases
            ),
        )


def settings_from_dict(data: dict[str, Any]) -> TrainSettings:
    """The settings ``training.json`` stores, back as a ``TrainSettings`` (strict: every field of its type)."""
    version = data.get("data_version", 1) if isinstance(data, dict) else None  # a record older than the field: 1
    if version != TrainSettings.data_version:
        raise StudyError(
            f"training.json settings: data_version {version} is an earlier recipe's data "
            f"(retrieval questions without RULER's answer prefix); this code builds version {TrainSettings.data_version} only"
        )
    try:
        return _SETTINGS.validate_json(json.dumps(data))  # JSON mode: a list is read as a tuple
    except ValidationError as exc:
        raise StudyError(f"training.json settings: {first_error(exc)}; expected the fields of TrainSettings") from None


def first_error(exc: ValidationError) -> str:
    """pydantic's first error as ``field.path: message``."""
    err = exc.errors(include_url=False)[0]
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"


_SETTINGS = TypeAdapter(TrainSettings)


def stage_at(settings: TrainSettings, step: int, phase: int = 0) -> Stage:
    """The stage a (0-based) step of a phase belongs to."""
    end = 0
    for stage in settings.phases[phase].stages:
        end += stage.steps
        if step < end:
            return stage
    raise StudyError(f"step: {step} is past the last stage of phase {phase} ({settings.phases[phase].steps} steps)")


def learning_rate(settings: TrainSettings, step: int, phase: int = 0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the phase's peak."""
    current = settings.phases[phase]
    if step < current.warmup_steps:
        return current.lr * (step + 1) / current.warmup_steps
    span = max(1, current.steps - current.warmup_steps)
    progress = min(1.0, (step - current.warmup_steps) / span)
    floor = settings.min_lr_ratio
    return current.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
