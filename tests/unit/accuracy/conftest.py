"""Fixtures for the accuracy tests: lm-eval ``--log_samples`` rows and files in lm-eval 0.4.13's format.

The project runs pytest with ``--import-mode=importlib``, so test modules cannot import a helper
module next to them; the builders below reach the tests through the ``lmeval`` fixture.

Written from the format's description (lm_eval/evaluator.py builds each row; the evaluation
tracker writes ``samples_<task>_<date>.jsonl``, one row per document per filter, filters in the
outer loop): doc_id, doc, target, arguments, resps, filtered_resps, filter, metrics, doc_hash,
prompt_hash, target_hash, then one key per metric.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

FILTERS = ("strict-match", "flexible-extract")
DATE = "2026-08-21T19-56-54.123456"
UNTIL = ["Question:", "</s>", "<|im_end|>"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def gsm8k_doc(doc_id: int) -> dict[str, str]:
    return {
        "question": f"Tom has {doc_id} apples and buys 3 more. How many apples has he?",
        "answer": f"He has {doc_id} + 3 = {doc_id + 3} apples.\n#### {doc_id + 3}",
    }


def gsm8k_row(
    doc_id: int,
    correct: bool,
    filter_name: str = "strict-match",
    doc: Mapping[str, Any] | None = None,
    response: str | None = None,
    max_gen_toks: int = 256,
    **extra: Any,
) -> dict[str, Any]:
    """One row as lm-eval logs it for a generate_until task scored by exact_match."""
    doc = dict(doc if doc is not None else gsm8k_doc(doc_id))
    target = doc["answer"]
    answer = str(doc_id + 3) if correct else str(doc_id + 4)
    if response is None:
        response = f" Tom had {doc_id} apples and bought 3.\n#### {answer}"
    prompt = f"Question: {doc['question']}\nAnswer:"
    row = {
        "doc_id": doc_id,
        "doc": doc,
        "target": target,
        "arguments": {
            "gen_args_0": {
                "arg_0": prompt,
                "arg_1": {"until": UNTIL, "do_sample": False, "temperature": 0.0, "max_gen_toks": max_gen_toks},
            }
        },
        "resps": [[response]],
        "filtered_resps": [answer if correct or "####" in response else "[invalid]"],
        "filter": filter_name,
        "metrics": ["exact_match"],
        "doc_hash": sha(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": sha(prompt),
        "target_hash": sha(str(target)),
        "exact_match": 1.0 if correct else 0.0,
    }
    row.update(extra)
    return row


def rows_for(outcomes: Mapping[int, bool], filters: Iterable[str] = FILTERS, **kwargs: Any) -> list[dict[str, Any]]:
    """Rows for every filter (outer) and document (inner), as lm-eval orders them."""
    return [gsm8k_row(doc_id, ok, f, **kwargs) for f in filters for doc_id, ok in outcomes.items()]


def write_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_samples(
    folder: Path,
    outcomes: Mapping[int, bool],
    *,
    task: str = "gsm8k",
    run: str = "run",
    shuffle_seed: int | None = None,
    filters: Iterable[str] = FILTERS,
    **kwargs: Any,
) -> Path:
    """``folder/run/samples_<task>_<date>.jsonl``; ``shuffle_seed`` shuffles the line order."""
    rows = rows_for(outcomes, filters, **kwargs)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rows)
    return write_rows(folder / run / f"samples_{task}_{DATE}.jsonl", rows)


@pytest.fixture(scope="session")
def lmeval() -> SimpleNamespace:
    """The row and file builders above (session-scoped, so hypothesis tests can use them)."""
    return SimpleNamespace(
        FILTERS=FILTERS,
        DATE=DATE,
        sha=sha,
        gsm8k_doc=gsm8k_doc,
        gsm8k_row=gsm8k_row,
        rows_for=rows_for,
        write_rows=write_rows,
        write_samples=write_samples,
    )
