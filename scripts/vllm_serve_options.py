"""Write data/vllm/serve_options.json: the option strings of the installed vLLM's serve parser.

The table ``kvstudy.vllm.command`` resolves user server arguments against where vLLM is not
installed (with vLLM installed it reads the live table the same way, in a child process). Re-run it
after the pinned vLLM changes:

    KVSTUDY_NO_VLLM=0 PYTHONPATH=src .venv/bin/python scripts/vllm_serve_options.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from kvstudy.io import REPO_ROOT, write_text_atomic
from kvstudy.vllm.command import live_table
from kvstudy.vllm.facts import SERVE_OPTIONS_SNAPSHOT


def main() -> int:
    table = live_table()
    if table is None:
        print("vLLM's serve parser could not be read here (is vLLM installed, KVSTUDY_NO_VLLM unset?)", file=sys.stderr)
        return 1
    version = table.source.split("'s options")[0]
    when = dt.date.today().isoformat()
    data = {
        "source": f"captured by this project from {version}'s make_arg_parser, {when}",
        "vllm": version,
        "allow_abbrev": table.allow_abbrev,
        "options": table.options,
    }
    path = REPO_ROOT / SERVE_OPTIONS_SNAPSHOT
    rows = ",\n".join(f"  {json.dumps(option)}" for option in data.pop("options"))  # one option a line
    head = json.dumps(data, indent=1)[:-2]
    write_text_atomic(path, f'{head},\n "options": [\n{rows}\n ]\n}}\n')
    print(f"{path}: {len(table.options)} options from {table.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
