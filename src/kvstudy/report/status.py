"""The one checked reader of ``reports/<profile>/status.json``: what the render recorded per notebook
(its finding, its error, its verdicts), read for the index, the card and ``kvstudy verdict``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.io import read_json


class _Verdict(TypedDict, total=False):
    topic: str | None
    state: str | None
    text: str | None
    next_step: str | None
    facts: dict[str, Any] | None


class _Entry(TypedDict, total=False):
    """The fields of a status entry a reader uses (others are kept as they are)."""

    rendered: str | None
    error: str | None
    finding: str | None
    needs: str | None
    failed_html: str | None
    seconds: float | None
    verdicts: list[_Verdict] | None


_STATUS = TypeAdapter(dict[str, _Entry])


def read_status(path: Path) -> dict[str, dict[str, Any]]:
    """``status.json`` as a render wrote it, each field of an entry and of its verdicts of its type
    (strict: a number is not a string), else one line naming the file and the field."""
    status: dict[str, dict[str, Any]] = read_json(path)
    try:
        _STATUS.validate_python(status, strict=True)
    except ValidationError as exc:
        raise StudyError(f"{path}: {one_line(exc)}") from None
    return status
