"""``kvstudy startup-log --model`` on logs from the field (issue 30 item 3, issue 35 items 4 and 9):
tensor-parallel logs checked against the smallest worker pool (the one vLLM uses), a hybrid pool
logged the pre-0.18 way (``num_blocks // groups x block_size``: gpt-oss-20b's 282,624 tokens), a log
naming the model by its Hugging Face cache snapshot path, and bounded work on a 10,000-layer config.

Unit tests run the rules' path (tests/conftest.py sets KVSTUDY_NO_VLLM=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.cli import main
from kvstudy.model import log_check

ROOT = Path(__file__).resolve().parents[3]
PUBLIC = ROOT / "tests" / "fixtures" / "startup-logs"
QWEN3_14B = ROOT / "tests" / "fixtures" / "startup-models" / "Qwen3-14B"
GPT_OSS = ROOT / "data" / "models" / "gpt-oss-20b"
E = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [kv_cache_utils.py:1] "
W = "(VllmWorker TP{} pid=1{}) INFO 01-01 00:00:00 [gpu_worker.py:1] "


def _log(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tensor_parallel_workers_are_checked_against_the_smallest_pool(tmp_path: Path) -> None:
    """The public Qwen3-14B pool (6.51 GiB -> 42,656 tokens) logged by one worker, a second worker with
    more memory logging a larger pool last: the engine used the smaller, and that one agrees."""
    public = (PUBLIC / "lmcache-1739-qwen3-14b-gpu.log").read_text().splitlines()[1:]
    log = _log(
        tmp_path,
        "tp.log",
        [
            *public,
            W.format(1, 1) + "Available KV cache memory: 6.70 GiB",
            E + "GPU KV cache size: 43,888 tokens",
            E + "Maximum concurrency for 32,768 tokens per request: 1.34x",
        ],
    )
    result = log_check.check_log(log, QWEN3_14B)
    assert result["agree"] is True, result["agreement"]
    logged = result["logged"]
    assert logged["pool_tokens"] == 42_656 and logged["pool_tokens_logged"] == [42_656, 43_888]
    assert logged["available_kv_memory_gib"] == pytest.approx(6.51) and logged["pool_blocks"] == 2666


def _gpt_oss_log(tmp_path: Path, version: str) -> Path:
    """gpt-oss-20b (12 sliding + 12 full layers: two layer groups) with 12.94 GiB of KV memory and a
    131,072-token max length; the 282,624 tokens are what vLLM 0.10-0.17 log for it."""
    return _log(
        tmp_path,
        f"gpt-oss-{version}.log",
        [
            f"(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version {version}",
            "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: 12.94 GiB",
            E + "GPU KV cache size: 282,624 tokens",
            E + "Maximum concurrency for 131,072 tokens per request: 4.18x",
        ],
    )


def test_a_hybrid_pool_logged_per_group_before_0_18_agrees(tmp_path: Path) -> None:
    result = log_check.check_log(_gpt_oss_log(tmp_path, "0.11.0"), GPT_OSS)
    assert result["agree"] is True, result["agreement"]
    assert result["logged"]["pool_blocks"] in (35_328, 35_329)
    assert result["predicted"]["num_groups"] == 2
    assert result["logged"]["pool_tokens_formula"].startswith("blocks // layer groups")


def test_the_same_figure_from_a_0_32_log_disagrees(tmp_path: Path) -> None:
    """0.18+ log concurrency x max length (547k tokens for this memory): 282,624 is not a 0.32 pool."""
    result = log_check.check_log(_gpt_oss_log(tmp_path, "0.32.0"), GPT_OSS)
    assert result["agree"] is False
    assert result["logged"]["pool_tokens_formula"].startswith("int(blocks / blocks per request")


def test_a_log_without_a_version_tries_both_formulas(tmp_path: Path) -> None:
    lines = _gpt_oss_log(tmp_path, "x").read_text().splitlines()[1:]
    result = log_check.check_log(_log(tmp_path, "noversion.log", lines), GPT_OSS)
    assert result["agree"] is True and "names no vLLM version" in result["agreement"]


@pytest.mark.parametrize(
    "logged",
    [
        "/root/.cache/huggingface/hub/models--Qwen--Qwen3-14B/snapshots/8268fe3026cb304910457689366670e803a6fd56",
        "/root/.cache/huggingface/hub/models--Qwen--Qwen3-14B/snapshots/8268fe3026cb304910457689366670e803a6fd56/",
        "C:\\Users\\me\\.cache\\huggingface\\hub\\models--Qwen--Qwen3-14B\\snapshots\\8268fe3026cb3049",
    ],
)
def test_a_cache_snapshot_path_names_its_model(tmp_path: Path, logged: str) -> None:
    config = (
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with "
        f"config: model='{logged}', speculative_config=None, dtype=torch.bfloat16, max_seq_len=32768"
    )
    public = (PUBLIC / "lmcache-1739-qwen3-14b-gpu.log").read_text().splitlines()[1:]
    result = log_check.check_log(_log(tmp_path, "snapshot.log", [config, *public]), QWEN3_14B)
    assert result["agree"] is True


def test_a_snapshot_of_another_model_is_still_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = (
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with "
        "config: model='/hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f249a16976918f6564b8830bc894c89659', "
        "dtype=torch.bfloat16, max_seq_len=32768"
    )
    public = (PUBLIC / "lmcache-1739-qwen3-14b-gpu.log").read_text().splitlines()[1:]
    log = _log(tmp_path, "other.log", [config, *public])
    assert main(["startup-log", str(log), "--model", str(QWEN3_14B)]) == 2
    err = capsys.readouterr().err
    assert "'llama-3.1-8b'" in err and "--any-name" in err and err.count("\n") == 1


def test_ten_thousand_layers_and_a_one_token_max_length_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Neither vLLM's model build nor its pool code is handed 10,000 layers (limits.MAX_POOL_CODE_LAYERS):
    the rules answer; a one-token max length is checked like any other."""
    config = json.loads((QWEN3_14B / "config.json").read_text())
    config["num_hidden_layers"] = 10_000
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    public = (
        (PUBLIC / "lmcache-1739-qwen3-14b-gpu.log")
        .read_text()
        .replace("32,768 tokens per request", "1 tokens per request")
    )
    log = _log(tmp_path, "one.log", public.splitlines()[1:])
    result = log_check.check_log(log, folder, any_name=True)
    assert "not asked for 10,000 layers" in result["predicted"]["path"]
    assert any("not asked to build 10,000 layers" in n for n in result["kv_figures_notes"])
    assert result["logged"]["max_model_len"] == 1 and result["agree"] is False
    assert main(["startup-log", str(log), "--model", str(folder), "--any-name"]) == 1
