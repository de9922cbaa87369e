"""The one checked reader of ``reports/<profile>/status.json``: what the render recorded per notebook
(its finding, its error, its verdicts), read for the index, the card and ``kvstudy verdict``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import read_json, type_name

# The fields of a status entry a reader uses, and the JSON types each may have.
_ENTRY_TEXT = ("rendered", "error", "finding", "needs", "failed_html")
_VERDICT_TEXT = ("topic", "state", "text", "next_step")


def read_status(path: Path) -> dict[str, dict[str, Any]]:
    """``status.json`` as a render wrote it: an object of notebook -> entry, each entry an object whose
    texts are strings (or null), ``seconds`` a number and ``verdicts`` a list of objects; else one
    line naming the file and the field (the card and the index read nothing unchecked)."""

    def require(ok: bool, where: str, expected: str, value: Any) -> None:
        if not ok:
            raise StudyError(f"{where}: expected {expected}, got {type_name(value)}")

    status = read_json(path)
    require(isinstance(status, dict), str(path), "a JSON object (the render's status)", status)
    for stem, entry in status.items():
        where = f"{path}: {str(stem)[:80]}"
        require(isinstance(entry, dict), where, "a status entry (a JSON object)", entry)
        for key in _ENTRY_TEXT:
            require(
                entry.get(key) is None or isinstance(entry[key], str),
                f"{where}.{key}",
                "a string or null",
                entry.get(key),
            )
        seconds = entry.get("seconds")
        ok = seconds is None or (isinstance(seconds, (int, float)) and not isinstance(seconds, bool))
        require(ok, f"{where}.seconds", "a number or null", seconds)
        verdicts = entry.get("verdicts")
        require(verdicts is None or isinstance(verdicts, list), f"{where}.verdicts", "a list of verdicts", verdicts)
        for i, v in enumerate(verdicts or []):
            at = f"{where}.verdicts[{i}]"
            require(isinstance(v, dict), at, "a verdict (a JSON object)", v)
            for key in _VERDICT_TEXT:
                require(v.get(key) is None or isinstance(v[key], str), f"{at}.{key}", "a string", v.get(key))
            require(v.get("facts") is None or isinstance(v["facts"], dict), f"{at}.facts", "an object", v.get("facts"))
    return status
