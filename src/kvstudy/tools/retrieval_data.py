"""A seeded generator of RULER-style long-context retrieval items (key/value lists and needles).

Contexts come from a ``random.Random`` seeded with a string (the same items on any machine and
process). Items may share a context (``questions_per_context`` > 1): the statistics cluster on
``context_id``. As in RULER, the prompt (``prompt_text``) ends with an answer prefix restating what
is asked, so the value is what follows the same words in the context; the expected completion is
``" {answer}"``. ``context_tokens_approx`` (``len(context) / chars_per_token``) is exact for the
trained byte-level model, an estimate for other tokenizers. ``kvstudy retrieval-data FOLDER``
writes a ``RetrievalSet`` (``write_retrieval_data``); the same command always writes the same bytes.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import file_digest, write_json_atomic, write_jsonl_atomic
from kvstudy.limits import MAX_AXIS_VALUES, MAX_GENERATED_CHARS, MAX_TOKENS
from kvstudy.outputs import claim_output_folder, record_says

KINDS = ("kv", "needle")
# per kind: the question asked about a key, and the words the answer starts with (RULER's answer
# prefix: the context's words before the value)
QUESTIONS = {"kv": "What is the value of {}?", "needle": "What is the special magic number for {}?"}
ANSWER_PREFIXES = {"kv": "{}:", "needle": "The special magic number for {} is"}
DEFAULT_SEED = 20261130

# the haystack's words (no digits, so a filler sentence never looks like an answer)
FILLER_SUBJECTS = tuple(
    "The river, A small dog, The old house, Every morning the baker, The green hill, A quiet student, "
    "The market, Our neighbour, The night train, A tall tree, The school bus, My aunt".split(", ")
)
FILLER_VERBS = tuple(
    "watched found carried painted visited followed heard cleaned opened passed counted remembered".split()
)
FILLER_OBJECTS = tuple(
    "the bright window, a wooden box, the empty road, some warm bread, a blue kite, the long bridge, "
    "the garden gate, a paper map, the tiny boat, an old song, the red door, a stack of letters".split(", ")
)
FILLER_ENDS = tuple(
    "before noon, after the rain, in the evening, near the station, with great care, for a while, on Sunday, "
    "without a word".split(", ")
)
_FILLER_TEXT = " ".join(FILLER_SUBJECTS + FILLER_VERBS + FILLER_OBJECTS + FILLER_ENDS).lower()


@dataclass(frozen=True)
class Entry:
    """One key and its value, as written into a context."""

    key: str
    value: str


def _key(rng: random.Random, used: set[str]) -> str:
    """A new five-letter key that is no other key and no part of the filler text."""
    while True:
        key = "".join(rng.choice(string.ascii_lowercase) for _ in range(5))
        if key not in used and key not in _FILLER_TEXT:
            used.add(key)
            return key


def kv_line(entry: Entry) -> str:
    """The line a ``kv`` context holds for one entry."""
    return f"{entry.key}: {entry.value}"


def needle_sentence(entry: Entry) -> str:
    """The sentence a ``needle`` context holds for one entry."""
    return f"The special magic number for {entry.key} is {entry.value}."


def kv_context(rng: random.Random, target_chars: int) -> tuple[str, list[Entry]]:
    """Key/value lines until the text reaches ``target_chars`` characters (at least two lines)."""
    used: set[str] = set()
    entries: list[Entry] = []
    length = -1
    while length < target_chars or len(entries) < 2:
        entry = Entry(_key(rng, used), str(rng.randint(10000, 99999)))
        entries.append(entry)
        length += len(kv_line(entry)) + 1
    return "\n".join(kv_line(e) for e in entries), entries


def needle_context(
    rng: random.Random, target_chars: int, n_needles: int, depth: float | None = None
) -> tuple[str, list[Entry]]:
    """Filler sentences with ``n_needles`` needles, about ``target_chars`` long. With ``depth`` (0 to 1) the first
    entry's needle sits at that share of the sentences and the others at random places; without it every needle is
    at a random place."""
    used: set[str] = set()
    entries = [Entry(_key(rng, used), str(rng.randint(10000, 99999))) for _ in range(n_needles)]
    needle_chars = sum(len(needle_sentence(e)) + 1 for e in entries)
    sentences: list[str] = []
    length = -1
    while length + needle_chars < target_chars or not sentences:
        sentence = (
            f"{rng.choice(FILLER_SUBJECTS)} {rng.choice(FILLER_VERBS)} "
            f"{rng.choice(FILLER_OBJECTS)} {rng.choice(FILLER_ENDS)}."
        )
        sentences.append(sentence)
        length += len(sentence) + 1
    total = len(sentences) + n_needles
    if depth is None:
        slots = sorted(rng.sample(range(total), n_needles))  # entries in order of place
    else:
        first = min(total - 1, max(0, round(depth * (total - 1))))
        slots = [first] + rng.sample([i for i in range(total) if i != first], n_needles - 1)
    by_slot = dict(zip(slots, entries))
    filler = iter(sentences)
    out = [needle_sentence(by_slot[i]) if i in by_slot else next(filler) for i in range(total)]
    return " ".join(out), entries


def make_context(
    kind: str,
    target_tokens: int,
    rng: random.Random,
    chars_per_token: float = 1.0,
    n_needles: int = 1,
    depth: float | None = None,
) -> tuple[str, list[Entry]]:
    """A context of ``kind`` about ``target_tokens`` tokens long, and the entries it holds. ``depth`` places the
    first needle of a ``needle`` context (see ``needle_context``)."""
    if kind not in KINDS:
        raise StudyError(f"retrieval kind: got {kind!r}, expected one of {', '.join(KINDS)}")
    if target_tokens < 16:
        raise StudyError(f"retrieval target_tokens: got {target_tokens}, expected >= 16")
    target_chars = int(target_tokens * chars_per_token)
    if kind == "kv":
        return kv_context(rng, target_chars)
    if n_needles < 1:
        raise StudyError(f"retrieval n_needles: got {n_needles}, expected >= 1")
    return needle_context(rng, target_chars, n_needles, depth)


# Where a key stands in a context of each kind: one pass over the text (searching the text once per
# key made a long kv context, with one key per line, quadratic).
_KEY_PLACES = {"kv": re.compile(r"^([a-z]{5}): ", re.M), "needle": re.compile(r"for ([a-z]{5}) is ")}


def generate_items(
    kind: str,
    lengths: Sequence[int],
    n_per_length: int,
    seed: int = DEFAULT_SEED,
    chars_per_token: float = 1.0,
    questions_per_context: int = 1,
    n_needles: int = 4,
) -> list[dict[str, Any]]:
    """``n_per_length`` items for each context length, their queried keys spread over depths. For each length,
    ``n_per_length / questions_per_context`` contexts are drawn; item ``i`` asks about the entry nearest depth ``(i
    + 0.5) / n_per_length`` (the share of the context before it), so every length covers the context from start to
    end. With one question per needle context, the queried needle is placed at that depth."""
    items: list[dict[str, Any]] = []
    for length in lengths:
        for i in range(n_per_length):
            depth = (i + 0.5) / n_per_length
            if i % questions_per_context == 0:  # the first item of each context (item 0 too)
                context_id = f"{kind}-{length}-{i // questions_per_context}"
                rng = random.Random(f"{seed}:{kind}:{length}:{i // questions_per_context}")  # no PYTHONHASHSEED
                placed = depth if questions_per_context == 1 else None
                context, entries = make_context(kind, length, rng, chars_per_token, n_needles, placed)
                places: dict[str, int] = {}  # each key -> where it first stands
                for match in _KEY_PLACES[kind].finditer(context):
                    places.setdefault(match.group(1), match.start(1))
            entry = min(entries, key=lambda e: abs(places[e.key] / len(context) - depth))  # nearest ``depth``
            items.append(
                {
                    "id": f"{kind}-{length}-{i}",
                    "kind": kind,
                    "context_id": context_id,
                    "context": context,
                    "question": QUESTIONS[kind].format(entry.key),
                    "answer_prefix": ANSWER_PREFIXES[kind].format(entry.key),
                    "answer": entry.value,
                    "context_tokens_approx": round(len(context) / chars_per_token),
                    "target_tokens": length,
                    "n_keys": len(entries),
                    "depth": round(places[entry.key] / len(context), 4),
                    "seed": seed,
                }
            )
    return items


def prompt_text(item: dict[str, Any]) -> str:
    """The prompt an item is asked with; the model should continue with ``" " + answer``."""
    return f"{item['context']}\n\nQuestion: {item['question']}\nAnswer: {item['answer_prefix']}"


def answer_of(completion: str) -> str:
    """The answer a completion gives: its first line, stripped."""
    return completion.strip().split("\n", 1)[0].strip()


def training_text(
    kind: str, target_tokens: int, rng: random.Random, n_questions: int, n_needles: int = 4
) -> tuple[str, list[tuple[int, int]]]:
    """A context followed by ``n_questions`` question/answer pairs, for training. Returns the text and the character
    spans ``(start, end)`` of each answer (``" value\\n\\n"``), the only places a retrieval loss should count."""
    context, entries = make_context(kind, target_tokens, rng, 1.0, n_needles)
    text = context
    spans: list[tuple[int, int]] = []
    for _ in range(n_questions):
        entry = rng.choice(entries)
        text += f"\n\nQuestion: {QUESTIONS[kind].format(entry.key)}\nAnswer: {ANSWER_PREFIXES[kind].format(entry.key)}"
        start = len(text)
        text += f" {entry.value}"
        spans.append((start, len(text) + 2))
    return text + "\n\n", spans


@dataclass(frozen=True)
class RetrievalSet:
    """What the retrieval file holds: every kind at every length."""

    lengths: tuple[int, ...] = (512, 1024, 2048, 4096)  # context lengths, tokens (bytes for the trained model)
    n_per_length: int = 8  # items per kind and length
    questions_per_context: int = 4  # items sharing one context (a cluster)
    n_needles: int = 4  # needles per haystack (the kv kind holds every line as a key)
    seed: int = DEFAULT_SEED
    kinds: tuple[str, ...] = KINDS
    chars_per_token: float = 1.0  # exact for the byte-level trained model

    def __post_init__(self) -> None:
        if not self.lengths or any(not 16 <= n <= MAX_TOKENS for n in self.lengths):
            shown = ",".join(map(str, self.lengths[:8])) + (",..." if len(self.lengths) > 8 else "")
            raise StudyError(f"--lengths: expected whole numbers from 16 to {MAX_TOKENS:,}, got {shown}")
        if len(self.lengths) > MAX_AXIS_VALUES:
            raise StudyError(f"--lengths: {len(self.lengths):,} lengths, expected at most {MAX_AXIS_VALUES:,}")
        if self.n_per_length % self.questions_per_context:
            raise StudyError(
                f"--n-per-length ({self.n_per_length}) must be a multiple of "
                f"--questions-per-context ({self.questions_per_context})"
            )
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise StudyError(f"kinds: unknown {bad}; expected some of {list(KINDS)}")
        # every item holds its whole context: bound the file, not only each number
        chars = len(self.kinds) * self.n_per_length * sum(self.lengths) * self.chars_per_token
        if chars > MAX_GENERATED_CHARS:
            raise StudyError(
                f"--lengths x --n-per-length x --chars-per-token: {len(self.kinds)} kinds x {self.n_per_length:,} items "
                f"x {sum(self.lengths):,} tokens x {self.chars_per_token:g} characters = {chars:,.0f} characters, "
                f"expected at most {MAX_GENERATED_CHARS:,} in one file"
            )


def items_for(spec: RetrievalSet) -> list[dict[str, Any]]:
    """Every item of the set, kind by kind, length by length."""
    settings = (spec.lengths, spec.n_per_length, spec.seed, spec.chars_per_token, spec.questions_per_context)
    return [item for kind in spec.kinds for item in generate_items(kind, *settings, spec.n_needles)]


GENERATOR = "retrieval-data"
SPEC_SOURCE = "generated by this project (kvstudy retrieval-data)"


_written_before = record_says("spec.json", "source", lambda source: source == SPEC_SOURCE)


def write_retrieval_data(folder: str | Path, spec: RetrievalSet = RetrievalSet(), force: bool = False) -> Path:
    """Write ``test.jsonl`` (what lm-eval's ``retrieval_offline`` reads: both kinds, every length) and ``spec.json``
    (settings, counts, the file's digest) into ``folder`` (``outputs.claim_output_folder``); returns the data file."""
    items = items_for(spec)  # settings checked before the folder is touched
    folder = claim_output_folder(folder, GENERATOR, force, recognise=_written_before)
    path = folder / "test.jsonl"
    write_jsonl_atomic(path, items)  # ASCII text: the same bytes as json.dumps' default
    write_json_atomic(
        folder / "spec.json",
        {
            "source": SPEC_SOURCE,
            "generator": "kvstudy.tools.retrieval_data.generate_items",
            "settings": asdict(spec),
            "items": len(items),
            "contexts": len({item["context_id"] for item in items}),
            "test_jsonl_digest": file_digest(path),
        },
    )  # kvstudy.io.file_digest
    return path
