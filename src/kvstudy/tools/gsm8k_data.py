"""A deterministic generator of GSM8K-format arithmetic word problems (not GSM8K itself).

The GSM8K test set cannot be downloaded on a machine without the hub, so the offline task reads
problems this module writes: each item is ``{"question", "answer"}`` where ``answer`` is a worked
solution, one step per line with GSM8K's calculator marks ``<<a*b=c>>``, ending ``#### N``.
That is the format lm-eval's gsm8k prompt, filters and metric expect. The problems are
multi-step grade-school arithmetic from a fixed set of templates; every number is drawn from a
``random.Random`` with a fixed seed, so the same seed always writes the same bytes.

    kvstudy gsm8k-data data/gsm8k          # writes train.jsonl and test.jsonl
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import read_jsonl, write_jsonl_atomic
from kvstudy.outputs import claim_output_folder

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
        raise StudyError(f"gsm8k_data: need n_test > 0 and n_train >= 8 (for 8 shots), got {n_test} and {n_train}")
    r = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {"test": [], "train": []}
    for split, size in (("test", n_test), ("train", n_train)):
        while len(splits[split]) < size:
            problem = r.choice(TEMPLATES)(r)
            if problem.question not in seen:
                seen.add(problem.question)
                splits[split].append(problem)
    return splits


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
