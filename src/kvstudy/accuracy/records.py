"""Per-item records of lm-eval runs, and lm-eval's ``--log_samples`` files read and paired.

A configuration's ``records.jsonl`` holds one JSON line per document: a :class:`QuestionRecord` per
GSM8K-format question, a :class:`RetrievalRecord` per retrieval item (with its context id, the
cluster of items sharing a context). Both pair two runs by ``doc_id``; ``records.jsonl`` is read
back into the type whose fields it holds.

lm-eval 0.4.2 and later (checked against 0.4.13) write ``samples_<task>_<date>.jsonl``: one JSON
object per document **per filter** (``doc_id``, ``doc``, ``target``, ``arguments``, ``resps``,
``filtered_resps``, ``filter``, ``metrics``, the ``*_hash`` digests and one key per metric). Rows
carry no task name (it comes from the file name), and lm-eval appends, so duplicate rows are
refused. lm-eval 0.4.0/0.4.1 wrote one JSON array with no ``filter`` key: read as one unnamed
filter (:data:`UNNAMED_FILTER`); such a file that repeats a ``doc_id`` is refused (its filters
cannot be told apart). Items pair by ``doc_id``; two files of different tasks or documents (ids,
``doc_hash``/``doc`` or ``target_hash`` differ) are refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvstudy.accuracy.configurations import GSM8K_FILTERS, RETRIEVAL_FILTERS, task_spec
from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.io import parse_json_text, parse_jsonl_text, read_jsonl, read_text_checked
from kvstudy.limits import MAX_FILE_NUMBER


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


# --------------------------------------------------------------------------- lm-eval samples files

DEFAULT_FILTER = "strict-match"  # GSM8K's primary filter in lm-eval
UNNAMED_FILTER = "(not recorded: lm-eval before 0.4.2)"  # rows without a ``filter`` key
DEFAULT_METRIC = "exact_match"
MAX_BYTES = 256 * 2**20  # a 500-question 8-shot GSM8K file is a few MB
_NAME = re.compile(r"^samples_(?P<task>.+)_\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?\.jsonl$")
_LENGTH_REASONS = ("length", "max_tokens", "max_length")
# keys of a row that are not per-document metric values
_KNOWN_KEYS = frozenset(
    "doc_id doc target arguments resps filtered_resps filter metrics doc_hash prompt_hash target_hash task task_name "
    "truncated finish_reason".split()
)


# --------------------------------------------------------------------------- one row


class SampleRow(BaseModel):
    """One document under one filter, as lm-eval logged it (only what the study uses): the keys read
    as logged (checked, strict), the others derived from the row by ``_derive``."""

    model_config = ConfigDict(strict=True, frozen=True)

    doc_id: int = Field(ge=0)
    filter: str = Field(UNNAMED_FILTER, min_length=1)  # lm-eval before 0.4.2 did not log it
    metrics: list[str] = []  # lm-eval's ``metrics`` list (empty if absent)
    doc_hash: str | None = None  # lm-eval's, or None when absent
    target_hash: str | None = None
    prompt_hash: str | None = None
    scores: dict[str, float]  # metric name -> value for this document
    doc_digest: str | None  # sha256 of the ``doc`` object (keys sorted), None if absent
    response: str | None  # the first raw generation (generate_until tasks)
    gen_limit: int | None  # ``max_gen_toks`` in the logged generation kwargs
    stopped_by_limit: bool | None  # what the row says (``finish_reason``/``truncated``), if anything
    task: str | None  # only if a row carries one (lm-eval's rows do not)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, row: Any) -> Any:
        if not isinstance(row, dict):
            return row
        doc, task, reason = row.get("doc"), row.get("task", row.get("task_name")), _first_text(row.get("finish_reason"))
        try:
            limit = row["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"]
        except (KeyError, TypeError, IndexError):
            limit = None
        return {
            **row,
            "scores": {
                k: float(v)
                for k, v in row.items()
                if k not in _KNOWN_KEYS
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and abs(v) <= MAX_FILE_NUMBER  # first: a 400-digit score is not a score (float() of it overflows)
                and math.isfinite(v)
            },
            "doc_digest": None
            if doc is None
            else hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest(),
            "response": _first_text(row.get("resps")),
            "gen_limit": limit if type(limit) is int and limit > 0 else None,
            "stopped_by_limit": row["truncated"]
            if isinstance(row.get("truncated"), bool)
            else (None if reason is None else reason in _LENGTH_REASONS),
            "task": task if isinstance(task, str) else None,
        }


def _first_text(value: Any) -> str | None:
    """``resps[0][0]`` when it is text (generation), else None (e.g. log-likelihood tasks)."""
    while isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, str) else None


def parse_row(row: Any) -> SampleRow:
    """One decoded JSON line to a :class:`SampleRow`; ValueError says what is wrong."""
    try:
        return SampleRow.model_validate(row)
    except ValidationError as exc:
        raise ValueError(one_line(exc)) from None


# --------------------------------------------------------------------------- one file


@dataclass(frozen=True)
class SampleFile:
    """The rows of one filter of one lm-eval samples file, one per doc_id, sorted by doc_id."""

    path: Path
    task: str | None  # from the file name (or the rows), None if unknown
    filter: str
    metric: str
    rows: tuple[SampleRow, ...]

    @property
    def doc_ids(self) -> tuple[int, ...]:
        return tuple(r.doc_id for r in self.rows)

    def correctness(self) -> dict[int, bool]:
        """doc_id -> right or wrong; the metric must be 0 or 1 per item for a paired test."""
        out = {}
        for r in self.rows:
            value = r.scores[self.metric]
            if value not in (0.0, 1.0):
                raise StudyError(
                    f"{self.path}: doc_id {r.doc_id}: {self.metric} is {value}, "
                    f"expected 0 or 1 per item for a paired right/wrong comparison"
                )
            out[r.doc_id] = value == 1.0
        return out


def task_from_name(path: str | Path) -> str | None:
    """The task in lm-eval's ``samples_<task>_<date>.jsonl`` file name, or None for other names."""
    match = _NAME.match(Path(path).name)
    return match.group("task") if match else None


def _read_rows(path: Path, max_bytes: int) -> list[SampleRow]:
    """Parse every line; lines end at "\\n" only (lm-eval writes U+2028 and U+0085 unescaped). A file
    that is one JSON array is lm-eval 0.4.0/0.4.1's format."""
    text = read_text_checked(path, max_bytes)
    if text.lstrip()[:1] == "[":
        try:
            data = parse_json_text(text, str(path))
        except StudyError as exc:
            if "malformed JSON" not in str(exc):
                raise  # else not one JSON array: a JSONL file whose first line is junk, read below line by line
        else:
            rows = []
            for number, row in enumerate(data):
                try:
                    rows.append(parse_row(row))
                except ValueError as exc:
                    raise StudyError(f"{path}: row {number}: not an lm-eval sample row ({exc})") from None
            return rows
    return parse_jsonl_text(text, path, parse_row, "an lm-eval sample row")


def _file_task(path: Path, rows: Sequence[SampleRow]) -> str | None:
    named = task_from_name(path)
    in_rows = {r.task for r in rows if r.task is not None}
    if len(in_rows) > 1:
        raise StudyError(f"{path}: rows from several tasks {sorted(in_rows)}; expected one task")
    row_task = next(iter(in_rows), None)
    if named and row_task and named != row_task:
        raise StudyError(f"{path}: the file name says task {named!r}, the rows {row_task!r}")
    return named or row_task


def _check_docs_agree(path: Path, rows: Sequence[SampleRow]) -> None:
    """The same doc_id must be the same document under every filter of one file."""
    seen: dict[int, SampleRow] = {}
    for r in rows:
        first = seen.setdefault(r.doc_id, r)
        if _same_doc(first, r) is False:
            raise StudyError(
                f"{path}: doc_id {r.doc_id} is a different document under filters "
                f"{first.filter!r} and {r.filter!r}; expected one document per id"
            )


def read_samples(
    path: str | Path, filter_name: str = DEFAULT_FILTER, metric: str = DEFAULT_METRIC, max_bytes: int = MAX_BYTES
) -> SampleFile:
    """Read one lm-eval samples file and keep the rows of ``filter_name`` (checked, by doc_id)."""
    path = Path(path)
    rows = _read_rows(path, max_bytes)
    if not rows:
        raise StudyError(f"{path}: no rows; expected one JSON object per document and filter")
    task = _file_task(path, rows)
    _check_docs_agree(path, rows)
    filters = tuple(sorted({r.filter for r in rows}))
    if UNNAMED_FILTER in filters and len(filters) > 1:
        raise StudyError(f"{path}: some rows name a filter and some do not; expected one lm-eval version's rows")
    if filters == (UNNAMED_FILTER,):
        filter_name = UNNAMED_FILTER  # lm-eval before 0.4.2: the file's rows are its only filter's
    if filter_name not in filters:
        raise StudyError(f"{path}: no rows for filter {filter_name!r}; the file has filters {list(filters)}")
    chosen = [r for r in rows if r.filter == filter_name]
    dupes = sorted(d for d, k in Counter(r.doc_id for r in chosen).items() if k > 1)
    if dupes:
        why = (
            "the rows name no filter (lm-eval before 0.4.2 logs one row per filter without its name): the "
            "filters cannot be told apart"
            if filter_name == UNNAMED_FILTER
            else "expected one row per document per filter (lm-eval appends: was a run written into an old file?)"
        )
        raise StudyError(f"{path}: doc_ids {dupes[:5]} appear more than once for filter {filter_name!r}; {why}")
    for r in chosen:
        if metric not in r.scores:
            have = sorted(set(r.metrics) | set(r.scores))
            raise StudyError(
                f"{path}: doc_id {r.doc_id} (filter {filter_name!r}) has no numeric metric {metric!r}; it has {have}"
            )
    chosen.sort(key=lambda r: r.doc_id)
    return SampleFile(path, task, filter_name, metric, tuple(chosen))


# --------------------------------------------------------------------------- two files


def _same_doc(a: SampleRow, b: SampleRow) -> bool | None:
    """True/False when the rows can be compared (doc_hash, else doc, and target_hash), else None."""
    verdicts = []
    if a.doc_hash is not None and b.doc_hash is not None:
        verdicts.append(a.doc_hash == b.doc_hash)
    elif a.doc_digest is not None and b.doc_digest is not None:
        verdicts.append(a.doc_digest == b.doc_digest)
    if a.target_hash is not None and b.target_hash is not None:
        verdicts.append(a.target_hash == b.target_hash)
    return all(verdicts) if verdicts else None


@dataclass(frozen=True)
class SamplePair:
    """Two runs of one task on the same documents, paired by doc_id."""

    baseline: SampleFile
    candidate: SampleFile
    doc_ids: tuple[int, ...]
    same_prompts: bool | None  # every prompt_hash equal (None: not logged); FP8 vs 16-bit should be


def read_pair(
    baseline: str | Path, candidate: str | Path, filter_name: str = DEFAULT_FILTER, metric: str = DEFAULT_METRIC
) -> SamplePair:
    """Read two sample files and pair them by doc_id; refuse different tasks, filters or document sets."""
    b, c = read_samples(baseline, filter_name, metric), read_samples(candidate, filter_name, metric)
    if b.task and c.task and b.task != c.task:
        raise StudyError(
            f"{c.path}: task {c.task!r}, but {b.path} is task {b.task!r}; expected two runs of the same task"
        )
    if (b.filter, b.metric) != (c.filter, c.metric):
        raise StudyError(
            f"{c.path}: filter/metric {c.filter}/{c.metric} differs from {b.filter}/{b.metric} in {b.path}"
        )
    ids_b, ids_c = set(b.doc_ids), set(c.doc_ids)
    if ids_b != ids_c:
        only_b, only_c = sorted(ids_b - ids_c)[:5], sorted(ids_c - ids_b)[:5]
        raise StudyError(
            f"{c.path}: a different document set from {b.path}: doc_ids only in the "
            f"baseline {only_b}, only in the candidate {only_c} (first 5 shown); "
            f"expected the same documents (same --limit and task)"
        )
    rows_c = {r.doc_id: r for r in c.rows}
    prompts = []
    for rb in b.rows:
        rc = rows_c[rb.doc_id]
        if _same_doc(rb, rc) is False:
            raise StudyError(
                f"{c.path}: doc_id {rb.doc_id} is a different document from the one "
                f"in {b.path} (doc_hash/target differ); expected the same document set"
            )
        if rb.prompt_hash is not None and rc.prompt_hash is not None:
            prompts.append(rb.prompt_hash == rc.prompt_hash)
    same_prompts = all(prompts) if len(prompts) == len(b.rows) else None
    return SamplePair(b, c, b.doc_ids, same_prompts)


# --------------------------------------------------------------------------- cut-off answers


@dataclass(frozen=True)
class Truncation:
    """Answers that hit the generation limit (an answer cut off cannot reach '#### N')."""

    path: Path
    checked: int
    cut_off: tuple[int, ...]  # doc_ids
    limit: int | None  # the logged max_gen_toks used for the check
    method: str  # "rows", "words (a lower bound)" or "not checked"

    def sentence(self) -> str:
        if self.method == "not checked":
            return (
                f"{self.path.name}: cut-off answers not checked (the rows record neither a "
                f"finish reason nor the generation limit)."
            )
        how = {
            "rows": "as the rows record",
            "words (a lower bound)": f"at {self.limit} tokens, counted as words (a lower "
            f"bound: some cut-off answers may be missed)",
        }[self.method]
        return (
            f"{self.path.name}: {len(self.cut_off)} of {self.checked} answers stopped at the generation limit ({how})."
        )


def cut_off_answers(samples: SampleFile) -> Truncation:
    """Which answers were cut off by the generation limit: as the rows say (``finish_reason`` or
    ``truncated``), else each response's length in words against the logged ``max_gen_toks`` (a lower
    bound on tokens)."""
    rows = samples.rows
    if rows and all(r.stopped_by_limit is not None for r in rows):
        return Truncation(samples.path, len(rows), tuple(r.doc_id for r in rows if r.stopped_by_limit), None, "rows")
    logged = {r.gen_limit for r in rows if r.gen_limit is not None}
    if not logged:
        return Truncation(samples.path, len(rows), (), None, "not checked")
    limit = min(logged)
    cut = tuple(
        r.doc_id for r in rows if r.stopped_by_limit or (r.response is not None and len(r.response.split()) >= limit)
    )
    return Truncation(samples.path, len(rows), cut, limit, "words (a lower bound)")
