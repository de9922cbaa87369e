"""Was per-token latency measured in a run? A check per run, before any TPOT enters a verdict.

A run's TPOT is a decode time only when the client saw the tokens one decode step at a time: not
when they arrived in bursts (an issue of this project saw all 32 tokens in one chunk after the
first), outputs were shorter than asked, requests failed, no request produced two tokens, or the
clock beside it was not sampled during the bench window. :func:`assess_run` says which, with the
figures behind each reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvstudy.bench.result import RequestRecord

# A gap below 0.1 ms is network or serialisation time, not a decode step: the fastest decode steps
# vLLM takes (small models on big GPUs) last about a millisecond, CPU steps tens of milliseconds.
NEAR_ZERO_GAP_S = 1e-4

# More than a quarter of the gaps at network speed: the client saw tokens in bursts (the server or
# a proxy coalesced the stream, or the client process was starved of CPU and read several events at
# once), so the gaps say more about delivery than about decode. Occasional pairs stay well below.
MAX_NEAR_ZERO_GAP_SHARE = 0.25

# vLLM streams one chunk per decode step per request (chunks / tokens = 1). Below one chunk per two
# tokens the stream was buffered (e.g. all tokens in one chunk after the first one) and
# (latency - TTFT) no longer spans the decode steps.
MIN_CHUNKS_PER_TOKEN = 0.5

# Any failed request makes the run unmeasurable: the TPOT of the survivors is a biased sample and
# the two arms no longer ran the same work.
MAX_FAILED_SHARE = 0.0

# Any successful request shorter than asked: the arms no longer decode the same number of tokens
# (and a shorter request decodes at a shorter context).
MAX_SHORT_OUTPUT_SHARE = 0.0

# At least one clock sample must fall inside the bench window for the run's clock to be known.
MIN_CLOCK_SAMPLES_IN_WINDOW = 1


@dataclass(frozen=True)
class Measurability:
    """Whether one run measured per-token latency, why not, and the figures behind each reason."""

    run: str
    measurable: bool
    reasons: list[str] = field(default_factory=list)
    requests: int = 0
    failed: int = 0
    tpot_requests: int = 0  # successful requests with more than one output token
    near_zero_gap_share: float | None = None
    chunks_per_token: float | None = None  # streamed chunks / output tokens, over successful requests
    short_outputs: int = 0
    expected_output_len: int | None = None
    window_s: float | None = None
    clock_interval_s: float | None = None
    clock_samples_in_window: int | None = None


def per_request_tpot_s(records: Sequence[RequestRecord]) -> np.ndarray:
    """vLLM's per-request TPOT in seconds: (latency - TTFT) / (output tokens - 1), successful
    requests with more than one output token only."""
    decode = np.asarray([r.e2el_ms / 1e3 - r.ttft_ms / 1e3 for r in records])
    out = np.asarray([r.output_len for r in records])
    ok = np.asarray([r.success for r in records], dtype=bool) & (out > 1)
    return decode[ok] / (out[ok] - 1.0)


def per_request_e2e_per_token_s(records: Sequence[RequestRecord]) -> np.ndarray:
    """End-to-end latency per output token (first token included), successful requests only.

    Shown, labelled, when TPOT was not measurable; never used for a TPOT verdict."""
    lat = np.asarray([r.e2el_ms / 1e3 for r in records])
    out = np.asarray([r.output_len for r in records])
    ok = np.asarray([r.success for r in records], dtype=bool) & (out > 0)
    return lat[ok] / out[ok]


def assess_run(
    records: Sequence[RequestRecord],
    name: str,
    *,
    expected_output_len: int | None = None,
    duration_s: float | None = None,
    clock_interval_s: float | None = None,
    clock_samples_in_window: int | None = None,
) -> Measurability:
    """Decide whether the run ``name`` (its requests in the order sent; ``duration_s`` its bench
    window) measured per-token latency (the clock figures are checked only when given)."""
    reasons: list[str] = []
    n = len(records)
    failed = sum(not r.success for r in records)
    tpot_requests = int(per_request_tpot_s(records).size)
    ok = [r for r in records if r.success and r.output_len > 0]  # the gap figures are over these
    gaps = [g / 1e3 for r in ok for g in r.itls_ms]
    tokens = sum(r.output_len for r in ok)
    share = sum(g < NEAR_ZERO_GAP_S for g in gaps) / len(gaps) if gaps else None
    chunks_per_token = sum(len(r.itls_ms) + 1 for r in ok) / tokens if tokens else None
    expected = expected_output_len
    short = 0 if expected is None else sum(r.success and r.output_len < expected for r in records)

    if n == 0:
        reasons.append("no requests")
    if n and failed / n > MAX_FAILED_SHARE:
        reasons.append(f"{failed} of {n} requests failed")
    if n and tpot_requests == 0:
        reasons.append("no successful request produced more than one output token: there is no TPOT")
    if share is not None and share > MAX_NEAR_ZERO_GAP_SHARE:
        reasons.append(
            f"tokens arrived in bursts: {share:.0%} of inter-token gaps were under "
            f"{NEAR_ZERO_GAP_S * 1e3:g} ms (at most {MAX_NEAR_ZERO_GAP_SHARE:.0%} allowed)"
        )
    if chunks_per_token is not None and chunks_per_token < MIN_CHUNKS_PER_TOKEN:
        reasons.append(
            f"tokens arrived in bursts: {chunks_per_token:.2f} streamed chunks per output token "
            f"(at least {MIN_CHUNKS_PER_TOKEN:g} expected, 1 when each decode step is streamed)"
        )
    ok_count = n - failed
    if expected_output_len is not None and ok_count and short / ok_count > MAX_SHORT_OUTPUT_SHARE:
        reasons.append(
            f"{short} of {ok_count} successful requests returned fewer than the {expected_output_len} output tokens asked for"
        )
    if clock_interval_s is not None and duration_s is not None and duration_s < clock_interval_s:
        reasons.append(
            f"the bench window ({duration_s:.3f} s) was shorter than the clock sampling interval "
            f"({clock_interval_s:g} s): the clock was not measured during the run"
        )
    if clock_samples_in_window is not None and clock_samples_in_window < MIN_CLOCK_SAMPLES_IN_WINDOW:
        reasons.append(
            f"{clock_samples_in_window} clock samples fell inside the bench window "
            f"(at least {MIN_CLOCK_SAMPLES_IN_WINDOW} needed)"
        )
    figures = (n, failed, tpot_requests, share, chunks_per_token, short, expected, duration_s, clock_interval_s)
    return Measurability(name, not reasons, reasons, *figures, clock_samples_in_window)
