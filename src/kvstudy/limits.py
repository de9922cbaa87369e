"""The bounds on every count and size a spec, a profile or a command may give, each named once.

They are generous for real use (a 10-million-token context, a hundred thousand users, a week-long
timeout) and exist so that a mistyped or hostile value is refused before any work starts, in one
line that names the bound, instead of running for hours or filling memory. Specs check their
fields through the bounded types below (pydantic constraints, ``kvstudy.bench.spec``), and so does a
profile's check of a notebook parameter; commands take :func:`int_arg` / :func:`float_arg` as argparse types.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import Field

from kvstudy.errors import StudyError
from kvstudy.io import bounded_float, bounded_int, leaves

N = TypeVar("N", int, float)

MAX_TOKENS = 10_000_000  # a length in tokens (context, input, output, max_model_len): above any model's
MAX_USERS = 100_000  # concurrent requests of one benchmark cell
MAX_REQUESTS = 1_000_000  # requests, prompts or warm-ups per user or per cell
MAX_ITEMS = 1_000_000  # questions, contexts or records a generated or evaluated set may hold
MAX_SHOTS = 1_000  # few-shot examples in one prompt
MAX_NEEDLES = 10_000  # needles or questions in one retrieval context
MAX_AXIS_VALUES = 10_000  # values on one axis of a grid (seeds, user counts, input lengths)
MAX_SEED = 2**63 - 1  # a seed's value
MAX_ARMS = 100  # KV configurations (arms) of one grid
MAX_GRID_CELLS = 100_000  # benchmark cells of one grid (each runs for seconds to minutes)
MAX_LAYERS = 10_000  # decoder layers: no model has more
MAX_POOL_CODE_LAYERS = 1_000  # layers handed to vLLM's own pool code in a child (it groups them pairwise)
MAX_EXPERTS = 1_000_000  # routed experts of one layer (the largest models have a few hundred)
MAX_GIB = 1_048_576.0  # GiB of memory (a GPU, a KV pool, weights): 1 PiB
MAX_BYTES = 2**50  # bytes of memory (a KV pool): 1 PiB
MAX_BLOCKS = 10**9  # KV cache blocks of a pool
MAX_TENSOR_PARALLEL = 4096  # GPUs one model is split over
MAX_SECONDS = 7 * 24 * 3600.0  # a timeout or interval: one week
MAX_BANDWIDTH_GB_S = 1e6  # memory bandwidth in GB/s (a GPU's is a few thousand)
MAX_CLOCK_MHZ = 100_000.0  # a processor clock in MHz (a GPU's is about 2,000)
MAX_REQUEST_RATE = 1e6  # requests per second a benchmark client sends
MAX_FACTOR = 1e6  # a scale, a multiplier or a characters-per-token figure
MAX_THREADS = 4096  # CPU threads of one run
MAX_TOP_K = 100  # log-probabilities per position asked of a server (vLLM's default max_logprobs is 20)
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # one HTTP answer read from a server (a top-20 of a 32k-token prompt is ~30 MB)
MAX_EXTENDS = 32  # profiles in one `extends` chain
MAX_GENERATED_CHARS = 2**27  # characters of one generated data file (items x their text): 128 Mi, seconds to write
MAX_DESIGN_VALUES = 10  # values of one `kvstudy design` option (--change, --margin-points)
MAX_DESIGN_ROWS = 24  # rows of one speed design (user counts x changes): each simulates the test
MAX_LOG_SD = 5.0  # SD of a per-seed log TPOT difference (5: a factor of about 150 between seeds)
DESIGN_CHANGE_PCT = (0.01, 900.0)  # a TPOT change a speed design plans for, in %
DESIGN_MARGIN_POINTS = (0.01, 99.0)  # a non-inferiority margin, in points
MAX_FILE_NUMBER = 2**53  # any number read from a config, a result or a sample file: past it a float loses units


# The bounds as types: a spec field or a notebook parameter declared with one is checked against it.
# A number is a float or an int, kept as given (a manifest's 1500 reads back as 1500, not 1500.0).
Number = float | int
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Users = Annotated[int, Field(ge=1, le=MAX_USERS)]
Requests = Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
Warmups = Annotated[int, Field(ge=0, le=MAX_REQUESTS)]
Items = Annotated[int, Field(ge=0, le=MAX_ITEMS)]
Shots = Annotated[int, Field(ge=0, le=MAX_SHOTS)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
AxisCount = Annotated[int, Field(ge=0, le=MAX_AXIS_VALUES)]
Blocks = Annotated[int, Field(ge=1, le=MAX_BLOCKS)]
Bytes = Annotated[int, Field(ge=1, le=MAX_BYTES)]
TensorParallel = Annotated[int, Field(ge=1, le=MAX_TENSOR_PARALLEL)]
Threads = Annotated[int, Field(ge=1, le=MAX_THREADS)]
Gib = Annotated[Number, Field(gt=0, le=MAX_GIB)]  # a pool a server is given
MemoryGib = Annotated[Number, Field(ge=0, le=MAX_GIB)]  # a memory figure that may be zero
Seconds = Annotated[Number, Field(gt=0, le=MAX_SECONDS)]
Milliseconds = Annotated[Number, Field(gt=0, le=1e9)]
Factor = Annotated[Number, Field(ge=0, le=MAX_FACTOR)]


def check_numbers(data: Any, where: str, largest: float = MAX_FILE_NUMBER) -> None:
    """Every number in a parsed JSON tree finite and within +-``largest``; else one line naming the
    first offending key's path (a 400-digit ``head_dim`` or ``1e999`` is refused here, before any
    arithmetic turns it into an OverflowError)."""
    for value, path in leaves(data):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        elif isinstance(value, float) and not math.isfinite(value):
            raise StudyError(f"{where}: {path[:120] or 'the value'} is {value!r}, expected a finite number")
        elif abs(value) > largest:
            raise StudyError(f"{where}: {path[:120] or 'the value'} is beyond +-{largest:.0f}, expected a real figure")


def int_arg(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [low, high], refused in one line naming the bound."""
    return _number_arg(bounded_int, low, high, f"an integer from {low:,} to {high:,}", "integer")


def float_arg(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in [low, high], refused in one line naming the bound."""
    return _number_arg(bounded_float, low, high, f"a number from {low:g} to {high:g}", "number")


def _number_arg(read: Callable[[str, str, N, N], N], low: N, high: N, expected: str, name: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            return read(text, "value", low, high)
        except StudyError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text[:40]!r}") from None

    parse.__name__ = name
    return parse


NAME_MAX = 255  # bytes of one file name (Linux filesystems' limit)
PATH_MAX = 4096  # bytes of a whole path


def check_output_path(path: str | Path, where: str, folder: bool) -> Path:
    """An output path the filesystem can hold: every name at most ``NAME_MAX`` bytes, the whole at
    most ``PATH_MAX``, no existing ancestor that is a file, and the path itself, where it exists, a
    folder (``folder``) or not a folder; else one line naming it."""
    path = Path(path)
    shown = str(path)[:120]
    if len(os.fsencode(str(path))) > PATH_MAX:
        raise StudyError(f"{where}: the path is {len(os.fsencode(str(path))):,} bytes, expected at most {PATH_MAX:,}")
    for name in path.parts:
        if len(os.fsencode(name)) > NAME_MAX:
            raise StudyError(
                f"{where}: a name of {len(os.fsencode(name))} bytes in {shown}, expected at most {NAME_MAX}"
            )
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise StudyError(f"{where}: {str(parent)[:120]} is a file, not a folder, so {shown} cannot be made")
            break
    if path.exists() and path.is_dir() != folder:
        raise StudyError(
            f"{where}: {shown} is {'a file' if folder else 'a folder'}, expected {'a folder' if folder else 'a file'}"
        )
    return path


def _path_arg(folder: bool) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            check_output_path(text, "path", folder)
        except StudyError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("path: ")) from None
        return text

    parse.__name__ = "folder" if folder else "file"
    return parse


output_folder = _path_arg(folder=True)  # an argparse type: an output folder check_output_path accepts
output_file = _path_arg(folder=False)  # an argparse type: an output file check_output_path accepts
