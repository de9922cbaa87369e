"""``kvstudy gsm8k`` on hostile input (issue 10): one line, truthful exit codes, no mixed models,
corrupt resume files named, earlier engine logs kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvstudy import capture, cli
from kvstudy.accuracy import runner as ge
from kvstudy.errors import StudyError


def _model(folder: Path, hidden: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    return folder


def _gsm8k(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["gsm8k", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [["--model", "/nonexistent/model"], ["--cpu-kvcache-space-gib", "nan"], ["--max-model-len", "0"], ["--n", "-3"]],
)
def test_bad_cli_values_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    model = _model(tmp_path / "m")
    argv = ["--model", str(model), "--capture", str(tmp_path / "cap"), *extra]
    code, err = _gsm8k(capsys, *argv)
    assert code == 2 and err.startswith("kvstudy: error:") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cap").exists()


@pytest.mark.parametrize(
    "name, content", [("bf16/status.json", "[1, 2]"), ("manifest.json", "[1]"), ("bf16/records.jsonl", "garbage\x00\n")]
)
def test_corrupt_resume_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str
) -> None:
    cap = tmp_path / "cap"
    (cap / "bf16").mkdir(parents=True)
    if name.endswith("records.jsonl"):
        (cap / "bf16" / "status.json").write_text(
            json.dumps({"name": "bf16", "label": "BF16", "state": "ok", "num_fewshot": 8})
        )
    (cap / name).write_text(content)
    code, err = _gsm8k(capsys, "--model", str(_model(tmp_path / "m")), "--capture", str(cap), "--configs", "bf16")
    assert code == 2 and len(err.strip().splitlines()) == 1 and Path(name).name in err, err


def test_another_model_is_refused_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstudy.vllm.command import ServerConfig

    one, two = _model(tmp_path / "one"), _model(tmp_path / "two", hidden=16)
    settings = ge.EvalSettings(n=2)
    ge.write_manifest(tmp_path / "cap", ["bf16"], one, settings, ServerConfig(model=str(one)))
    monkeypatch.setattr(ge, "run_group", lambda *a, **k: pytest.fail("started a server"))
    with pytest.raises(StudyError, match="other inputs.*model_digest"):
        ge.run_missing(["bf16"], two, tmp_path / "cap", settings, progress=lambda line: None)
    assert capture.read_manifest(tmp_path / "cap")["inputs"]["model"] == str(one)


class _NeverStarts:
    def __init__(self, config: Any, log_path: Path, ready_timeout_s: float = 0) -> None:
        self.log_path = log_path

    def __enter__(self) -> None:
        from kvstudy.vllm.server import EngineStartError

        self.log_path.write_text("attempt two: RuntimeError: boom\n")
        raise EngineStartError("vLLM server exited with code 1", self.log_path)

    def __exit__(self, *exc: object) -> None:
        pass


def test_failed_is_kept_unless_asked_and_retry_keeps_the_old_engine_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvstudy.vllm.server as server

    model, cap = _model(tmp_path / "m"), tmp_path / "cap"
    (cap / "bf16").mkdir(parents=True)
    (cap / "bf16" / "engine.log").write_text("attempt one\n")
    (cap / "bf16" / "status.json").write_text(
        json.dumps({"name": "bf16", "label": "BF16", "state": "failed", "diagnosis": "no AVX-512"})
    )
    monkeypatch.setattr(server, "VllmServer", _NeverStarts)
    argv = ["--model", str(model), "--capture", str(cap), "--configs", "bf16", "--n", "2"]
    code, err = _gsm8k(capsys, *argv)
    assert code == 1 and "bf16: failed: no AVX-512" in err  # kept, and the exit code says so
    assert (cap / "bf16" / "engine.log").read_text() == "attempt one\n"
    code, err = _gsm8k(capsys, *argv, "--retry-failed")
    assert code == 1 and "exited with code 1" in err
    assert (cap / "bf16" / "engine.attempt1.log").read_text() == "attempt one\n"
    assert "attempt two" in (cap / "bf16" / "engine.log").read_text()
