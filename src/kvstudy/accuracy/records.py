"""Per-item records of one configuration's lm-eval run, one JSON line per document: a
:class:`QuestionRecord` per GSM8K-format question, a :class:`RetrievalRecord` per retrieval item
(with its context id, the cluster of items sharing a context). Both pair two runs by ``doc_id``;
``records.jsonl`` is read back into the type whose fields it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.accuracy.configurations import GSM8K_FILTERS, RETRIEVAL_FILTERS, task_spec
from kvstudy.errors import StudyError
from kvstudy.io import read_jsonl


@dataclass(frozen=True)
class QuestionRecord:
    """One GSM8K-format question's outcome in one configuration."""

    doc_id: int
    prompt_hash: str  # lm-eval's sha256 of the full prompt (shots included)
    target: str  # the reference final answer
    response: str  # the generated text
    strict_answer: str  # extracted by strict-match ("[invalid]" when none)
    strict_correct: bool
    flexible_answer: str  # extracted by flexible-extract
    flexible_correct: bool

    def correct(self, filter_name: str = GSM8K_FILTERS[0]) -> bool:
        return self.strict_correct if filter_name == "strict-match" else self.flexible_correct


@dataclass(frozen=True)
class RetrievalRecord:
    """One retrieval item's outcome in one configuration."""

    doc_id: int
    item_id: str  # the generator's id, e.g. "needle-2048-5"
    prompt_hash: str
    kind: str  # "kv" or "needle"
    context_id: str  # items with the same id share one context (a cluster)
    context_tokens: int  # context length in tokens (retrieval_data's context_tokens_approx)
    target_tokens: int  # the length the generator aimed at (the table's "context length")
    depth: float  # where the queried key sits, as a share of the context
    n_keys: int  # keys in the context (chance of a random pick: 1 / n_keys)
    target: str  # the expected answer
    response: str  # the generated text
    answer: str  # the answer line (filter "answer-line")
    is_correct: bool

    def correct(self, filter_name: str = RETRIEVAL_FILTERS[0]) -> bool:
        if filter_name not in RETRIEVAL_FILTERS:
            raise StudyError(f"filter: expected one of {RETRIEVAL_FILTERS}, got {filter_name!r}")
        return self.is_correct


AnyRecord = QuestionRecord | RetrievalRecord


def _by_doc(samples: Iterable[Mapping[str, Any]], filters: Sequence[str]) -> dict[int, dict[str, Mapping[str, Any]]]:
    """lm-eval's samples (one per document and filter) grouped by doc_id, every filter present."""
    by_doc: dict[int, dict[str, Mapping[str, Any]]] = {}
    for sample in samples:
        by_doc.setdefault(int(sample["doc_id"]), {})[str(sample["filter"])] = sample
    for doc_id, per_filter in by_doc.items():
        missing = [f for f in filters if f not in per_filter]
        if missing:
            raise StudyError(f"lm-eval samples: doc_id {doc_id} lacks filters {missing}")
    return by_doc


def _right(sample: Mapping[str, Any]) -> bool:
    return bool(float(sample["exact_match"]) == 1.0)


def records_from_samples(samples: Iterable[Mapping[str, Any]], task: str = "gsm8k_offline") -> list[Any]:
    """lm-eval's logged samples of ``task`` (one per document and filter) to one record per document:
    a GSM8K question with both filters' answers, or a retrieval item with its context id and length."""
    retrieval = task_spec(task).kind == "retrieval"
    by_doc = _by_doc(samples, RETRIEVAL_FILTERS if retrieval else GSM8K_FILTERS)
    records: list[Any] = []
    for doc_id in sorted(by_doc):
        if not retrieval:
            strict, flexible = by_doc[doc_id]["strict-match"], by_doc[doc_id]["flexible-extract"]
            records.append(
                QuestionRecord(
                    doc_id=doc_id,
                    prompt_hash=str(strict.get("prompt_hash", "")),
                    target=str(strict["target"]).rsplit("#### ", 1)[-1].strip(),
                    response=str(strict["resps"][0][0]),
                    strict_answer=str(strict["filtered_resps"][0]),
                    strict_correct=_right(strict),
                    flexible_answer=str(flexible["filtered_resps"][0]),
                    flexible_correct=_right(flexible),
                )
            )
            continue
        sample = by_doc[doc_id][RETRIEVAL_FILTERS[0]]
        doc = sample.get("doc")
        if not isinstance(doc, Mapping) or not {"id", "kind", "context_id", "n_keys"} <= set(doc):
            raise StudyError(
                f"lm-eval samples: doc_id {doc_id} has no retrieval item (id, kind, context_id) in its logged doc"
            )
        records.append(
            RetrievalRecord(
                doc_id=doc_id,
                item_id=str(doc["id"]),
                prompt_hash=str(sample.get("prompt_hash", "")),
                kind=str(doc["kind"]),
                context_id=str(doc["context_id"]),
                context_tokens=int(doc["context_tokens_approx"]),
                target_tokens=int(doc["target_tokens"]),
                depth=float(doc["depth"]),
                n_keys=int(doc["n_keys"]),
                target=str(doc["answer"]),
                response=str(sample["resps"][0][0]),
                answer=str(sample["filtered_resps"][0]),
                is_correct=_right(sample),
            )
        )
    return records


def read_records(path: str | Path) -> list[Any]:
    """A ``records.jsonl`` back as records (every line of one type), or a StudyError naming the line."""
    kinds: list[Any] = [QuestionRecord, RetrievalRecord]

    def make(item: Any) -> Any:
        kind = next((t for t in kinds if isinstance(item, dict) and set(item) == set(t.__dataclass_fields__)), None)
        if kind is None:
            raise ValueError(f"expected the fields {sorted(kinds[0].__dataclass_fields__)}")
        kinds[:] = [kind]  # every later line must be of the first line's type
        return kind(**item)

    return read_jsonl(path, make, "an accuracy record")


def correctness(records: Sequence[AnyRecord], filter_name: str) -> dict[int, bool]:
    """doc_id -> correct under ``filter_name``, the input of the paired statistics."""
    allowed = RETRIEVAL_FILTERS if records and isinstance(records[0], RetrievalRecord) else GSM8K_FILTERS
    if filter_name not in allowed:
        raise StudyError(f"filter: expected one of {allowed}, got {filter_name!r}")
    return {r.doc_id: r.correct(filter_name) for r in records}
