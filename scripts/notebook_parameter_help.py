"""Write each spec field's description as its notebook parameter's trailing comment.

The notebooks of ``kvstudy.profiles.SPECS`` fill a declared spec: for every parameter named as a field
of it, the comment after the value (what ``papermill --help-notebook`` prints) is the field's
``description``, so the declaration is the one text. Re-run after changing a description:

    PYTHONPATH=src .venv/bin/python scripts/notebook_parameter_help.py
"""

from __future__ import annotations

import io
import json
import re
import sys
import tokenize

from pydantic import BaseModel

from kvstudy.io import REPO_ROOT
from kvstudy.profiles import SPECS

NAME = re.compile(r"^([A-Za-z_]\w*)\s*[:=]")


def with_help(source: str, spec: type[BaseModel]) -> str:
    """``source`` (a parameters cell) with each spec field's trailing comment set to its description."""
    lines = source.split("\n")
    for i, line in enumerate(lines):
        match = NAME.match(line)
        field = spec.model_fields.get(match.group(1)) if match else None
        if field is None or not field.description:
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
        comments = [t for t in tokens if t.type == tokenize.COMMENT]
        code = line[: comments[0].start[1]].rstrip() if comments else line.rstrip()
        lines[i] = f"{code}  # {field.description}"
    return "\n".join(lines)


def main() -> int:
    for stem, spec in SPECS.items():
        path = REPO_ROOT / "notebooks" / f"{stem}.ipynb"
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)  # json, not nbformat: keeps the file's key order, so only the comments change
        cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        cell["source"] = with_help("".join(cell["source"]), spec).splitlines(keepends=True)
        new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"{path.relative_to(REPO_ROOT)}: parameter comments rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
