"""Seconds one ``kvstudy capacity`` takes per model: without vLLM (the rules), and with vLLM installed,
cold (an empty answer cache) and warm (its answer kept on disk by the first call).

Each figure is the wall time of a fresh ``kvstudy capacity MODEL`` process (interpreter start and
imports included), the median of ``--repeats`` runs; the cold run is run once (it fills the cache).
Columns: ``no vLLM`` (KVSTUDY_NO_VLLM=1: the rules, or a one-line refusal); ``vLLM cold`` and
``vLLM warm`` (KVSTUDY_VLLM_SPECS=always: vLLM asked for every model, first with an empty answer
cache, then with the answer the first call kept); ``default`` (vLLM installed, default settings: the
rules answer the families they know and vLLM is not asked; a family they refuse, DeepSeek-V4, is
answered from the kept answer). Figures only, no assertions.

    .venv/bin/python benchmarks/bench_capacity.py [MODEL ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = [
    ROOT / "data" / "models" / "Qwen3-8B",
    ROOT / "data" / "models" / "Qwen3-Next-80B-A3B-Instruct",
    ROOT / "data" / "models" / "DeepSeek-V3",
    ROOT / "tests" / "fixtures" / "models" / "DeepSeek-V3.2",
    ROOT / "tests" / "fixtures" / "models" / "DeepSeek-V4-Flash",
]
CODE = "import sys; from kvstudy.cli import main; sys.exit(main())"


def run(model: Path, env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CODE, "capacity", str(model), "--max-model-len", "4096"],
        env=env,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    has_vllm = importlib.util.find_spec("vllm") is not None
    print(f"vLLM installed: {has_vllm}; median of {args.repeats} fresh processes; seconds per call (exit code)")
    print(f"{'model':<34}{'no vLLM':>14}{'vLLM cold':>14}{'vLLM warm':>14}{'default':>14}")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="kvstudy-bench-cache-") as cache:
            cells = []
            rules = [run(model, base | {"KVSTUDY_NO_VLLM": "1"}) for _ in range(args.repeats)]
            cells.append(rules)
            if has_vllm:
                env = base | {"KVSTUDY_NO_VLLM": "0", "KVSTUDY_CACHE_DIR": cache}
                asked = env | {"KVSTUDY_VLLM_SPECS": "always"}
                cells.append([run(model, asked)])  # cold: vLLM builds the model and the answer is kept
                cells.append([run(model, asked) for _ in range(args.repeats)])  # warm: read back
                cells.append([run(model, env | {"KVSTUDY_VLLM_SPECS": ""}) for _ in range(args.repeats)])
            text = [f"{statistics.median(t for t, _ in c):.2f} ({c[-1][1]})" for c in cells]
            print(f"{model.name[:33]:<34}" + "".join(f"{t:>14}" for t in text))


if __name__ == "__main__":
    main()
