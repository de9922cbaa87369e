"""``kvstudy speed compare BASE CAND``: the speed verdict on two folders of vLLM bench results.

Each folder holds ``vllm bench serve --save-result --save-detailed`` result files, one run each
(``*.json``; hidden files and vLLM's ``*.pytorch.json`` side files are skipped, other names are
ignored). What a result file holds, and the one reader of its per-request arrays, is in
:mod:`kvstudy.bench.result`; this module checks the settings the runs must share.

Runs compared must share the workload: model, number of prompts, concurrency, request rate,
backend, input length (median, within :data:`INPUT_LEN_TOLERANCE`) and output length (longest
output or ``--metadata output_len=N``, within :data:`OUTPUT_LEN_TOLERANCE`). A clock recorded with
``--metadata median_clock_mhz=X`` is used for the clock checks.

Bad input (a file that is not a detailed vLLM bench result, settings that differ, fewer than two
runs in a folder, an unreadable, huge or non-regular file) raises one StudyError naming the file
and what was wrong.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvstudy.bench.measurability import Measurability, assess_run
from kvstudy.bench.result import RequestRecord, check_run_settings, read_result_file, requests_from_result, result_files
from kvstudy.errors import StudyError
from kvstudy.io import is_finite_number
from kvstudy.speed.calibration import centred, minimum_detectable_change
from kvstudy.speed.verdict import ALPHA, CLOCK_TOLERANCE, Verdict, compare_runs, minimum_p_value, summarise_run

# Median input lengths of the random dataset vary by a token or two between seeds (vLLM re-aligns
# prompts to the server's tokenizer); a real difference in --input-len is far larger.
INPUT_LEN_TOLERANCE = 0.05
INPUT_LEN_SLACK_TOKENS = 2

# The longest output of a run is the asked length with --ignore-eos; without it (EOS allowed) it
# varies a little between runs of the same settings.
OUTPUT_LEN_TOLERANCE = 0.10

MIN_RUNS_PER_ARM = 2
# Simulated designs per step of the detectable-change search in the CLI (p < alpha alone, no bootstrap:
# about a second); the figure is a guide to the design's reach, the benchmark script computes it fully.
MDC_SIMULATIONS = 200

SETTINGS_KEYS = ("date", "model_id", "num_prompts", "duration", "completed", "latencies")
DATE_FORMAT = "%Y%m%d-%H%M%S"


@dataclass(frozen=True)
class BenchRun:
    """One vLLM bench result file, read."""

    path: Path
    name: str
    requests: list[RequestRecord]
    start_time_s: float | None
    duration_s: float
    median_clock_mhz: float | None
    settings: dict[str, Any]  # what every run of a comparison must share
    output_len_asked: bool  # the output length was given with --metadata (else the longest output)


@dataclass(frozen=True)
class Comparison:
    """The verdict on two folders, with each run's measurability and the shared settings."""

    baseline: Path
    candidate: Path
    verdict: Verdict
    measurability: dict[str, list[Measurability]]
    settings: dict[str, Any]
    detectable_change: float | None = None  # TPOT change detected with 80 % power by this design (fraction)
    files: dict[str, list[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------- reading


def _metadata_number(data: dict[str, Any], keys: Sequence[str]) -> float | None:
    """A number given with --metadata KEY=VALUE (stored as text by vLLM; checked by check_run_settings), or None."""
    return next((float(data[k]) for k in keys if data.get(k) is not None), None)


def run_from_result(data: dict[str, Any], path: str | Path) -> BenchRun:
    """Check one parsed result object and turn it into a :class:`BenchRun`."""
    path = Path(path)
    missing = [k for k in SETTINGS_KEYS if k not in data]
    if missing or not ("backend" in data or "endpoint_type" in data):
        raise StudyError(
            f"{path}: not a vLLM bench serve result (missing {', '.join(missing) or 'backend'}); "
            "expected a file written by vllm bench serve --save-result --save-detailed"
        )
    check_run_settings(data, str(path))
    records = requests_from_result(data, str(path), min_requests=1)
    duration = data["duration"]
    if not is_finite_number(duration) or duration <= 0:
        raise StudyError(f"{path}: duration is {duration!r}, expected a positive number of seconds")
    num_prompts = data["num_prompts"]
    if type(num_prompts) is not int or num_prompts < 1:
        raise StudyError(f"{path}: num_prompts is {num_prompts!r}, expected a positive whole number")
    try:  # wall-clock start: vLLM's ``date`` (local time at the end, 1 s resolution) minus the duration
        start = dt.datetime.strptime(str(data.get("date")), DATE_FORMAT).timestamp() - float(duration)
    except ValueError:
        start = None
    input_lens = [r.input_len for r in records if r.input_len is not None]
    asked = _metadata_number(data, ("output_len", "random_output_len"))
    settings: dict[str, Any] = {
        "model_id": data["model_id"],
        "num_prompts": num_prompts,
        "max_concurrency": data.get("max_concurrency"),
        "request_rate": data.get("request_rate"),
        "backend": data.get("backend", data.get("endpoint_type")),
        "input_len": float(np.median(input_lens)) if input_lens else None,
        "output_len": int(asked) if asked is not None else max(r.output_len for r in records),
    }
    if settings["request_rate"] not in (None, "inf"):
        settings["burstiness"] = data.get("burstiness")
    name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    clock = _metadata_number(data, ("median_clock_mhz",))
    return BenchRun(path, name, records, start, float(duration), clock, settings, asked is not None)


def read_bench_folder(folder: str | Path) -> list[BenchRun]:
    """Every run in ``folder`` (see :func:`result_files`), at least :data:`MIN_RUNS_PER_ARM` of them."""
    files = result_files(folder)
    if len(files) < MIN_RUNS_PER_ARM:
        names = ", ".join(p.name for p in files) or "none"
        raise StudyError(
            f"{folder}: holds {len(files)} vLLM bench result file(s) ({names}); a comparison needs at "
            f"least {MIN_RUNS_PER_ARM} runs per arm"
        )
    return [run_from_result(read_result_file(p), p) for p in files]


# (slack, share of the larger): the settings that may differ a little between runs of one workload
TOLERANCES = {"input_len": (INPUT_LEN_SLACK_TOKENS, INPUT_LEN_TOLERANCE), "output_len": (0, OUTPUT_LEN_TOLERANCE)}


def check_same_settings(runs: Sequence[BenchRun]) -> dict[str, Any]:
    """The settings all ``runs`` share (those of the first); a StudyError naming the first file that differs."""
    first = runs[0]
    for other in runs[1:]:
        for key in {**first.settings, **other.settings}:
            a, b = first.settings.get(key), other.settings.get(key)
            slack, share = TOLERANCES.get(key, (0, 0.0))
            close = key in TOLERANCES and (a is None or b is None or abs(a - b) <= max(slack, share * max(a, b)))
            if a != b and not close:
                raise StudyError(
                    f"{other.path}: {key} is {b!r}, but {first.path} has {a!r}; runs in one comparison "
                    "must share model, prompts, concurrency, request rate, backend and input/output "
                    "lengths"
                )
    return first.settings


def expected_output_len(runs: Sequence[BenchRun]) -> int | None:
    """The output length asked for: given with --metadata, else the longest output when at least half
    of all successful requests have it (a fixed length, as with --ignore-eos); else None (unknown)."""
    asked = {r.settings["output_len"] for r in runs if r.output_len_asked}
    if asked:
        return max(asked)
    lens = [q.output_len for r in runs for q in r.requests if q.success]
    longest = max(lens, default=0)
    return longest if lens and lens.count(longest) * 2 >= len(lens) else None


# --------------------------------------------------------------------------- comparing


def compare_folders(
    baseline: str | Path, candidate: str | Path, clock_tolerance: float = CLOCK_TOLERANCE
) -> Comparison:
    """Read both folders, check the runs share their settings, assess each run and give the verdict;
    on "no claim", the change this design would detect with 80 % power."""
    base_path, cand_path = Path(baseline), Path(candidate)
    if base_path.resolve() == cand_path.resolve():
        raise StudyError(f"{cand_path}: the same folder as the baseline; expected two folders of runs")
    base = read_bench_folder(base_path)
    cand = read_bench_folder(cand_path)
    settings = check_same_settings([*base, *cand])
    expected = expected_output_len([*base, *cand])
    arms = {"baseline": base, "candidate": cand}
    assessed = {
        label: [assess_run(r.requests, r.name, expected_output_len=expected, duration_s=r.duration_s) for r in arm]
        for label, arm in arms.items()
    }
    summaries = [
        [
            summarise_run(r.requests, m, start_time_s=r.start_time_s, median_clock_mhz=r.median_clock_mhz)
            for r, m in zip(arms[label], assessed[label])
        ]
        for label in arms
    ]
    verdict = compare_runs(*summaries, clock_tolerance=clock_tolerance)
    mdc = None
    if (
        verdict.verdict == "no claim"
        and verdict.tpot_ratio is not None
        and minimum_p_value(len(base), len(cand)) < ALPHA
    ):
        mdc = minimum_detectable_change(
            centred(summaries),
            n_per_arm=len(base),
            n_cand=len(cand),
            simulations=MDC_SIMULATIONS,
            precision=0.01,
            use_interval=False,
        )
        extra = (
            "with the run-to-run spread seen here, no change up to 300 % would be detected with 80 % power"
            if mdc is None
            else f"with {len(base)} vs {len(cand)} runs and the run-to-run spread seen here, a TPOT "
            f"change of about {mdc:.0%} would be detected with 80 % power"
        )
        verdict = replace(verdict, reasons=[*verdict.reasons, extra])
    return Comparison(
        baseline=base_path,
        candidate=cand_path,
        verdict=verdict,
        measurability=assessed,
        settings={**settings, "output_len_checked": expected},
        detectable_change=mdc,
        files={label: [str(r.path) for r in arm] for label, arm in arms.items()},
    )


def format_text(result: Comparison) -> str:
    """A short human-readable account of a comparison."""
    v = result.verdict
    lines = [
        f"baseline {result.baseline} ({v.runs['baseline']} runs) vs candidate {result.candidate} "
        f"({v.runs['candidate']} runs)",
        f"verdict: {v.verdict}",
    ]
    if v.tpot_ratio is not None and v.tpot_ratio_ci is not None and v.p_value is not None:
        lines.append(
            f"TPOT candidate / baseline: {v.tpot_ratio:.3f} (95 % interval {v.tpot_ratio_ci[0]:.3f} to "
            f"{v.tpot_ratio_ci[1]:.3f}), p = {v.p_value:.3g} (smallest possible {v.min_p_value:.3g})"
        )
    lines.append(f"per-token latency {'' if v.measurable else 'NOT '}measured in every run")
    lines.extend(f"- {reason}" for reason in v.reasons)
    return "\n".join(lines)
