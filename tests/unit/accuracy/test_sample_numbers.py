"""Issue 25: a sample file's huge score is refused or ignored in one line, never an OverflowError."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvstudy.cli import main


@pytest.mark.parametrize("literal", ["9" * 400, "1e999", "NaN"])
def test_huge_score_in_a_samples_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lmeval: SimpleNamespace, literal: str
) -> None:
    rows = lmeval.rows_for({i: i % 2 == 0 for i in range(20)})
    good = lmeval.write_rows(tmp_path / "b.jsonl", rows)
    lines = [json.dumps(r) for r in rows]
    lines[0] = lines[0].replace('"exact_match": 1.0', f'"exact_match": {literal}')
    bad = tmp_path / "a.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code = main(["accuracy", "compare", str(bad), str(good)])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err and err.count("\n") <= 1
