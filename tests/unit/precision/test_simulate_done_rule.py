"""kv-simulate keeps to the one done rule (capture.needs_run): an ok arm is kept only with its
log-p file, a failed one runs again only with --retry-failed."""

from __future__ import annotations

from pathlib import Path

from kvstudy import cli
from kvstudy.capture import needs_run
from kvstudy.io import write_jsonl_atomic
from kvstudy.precision import simulate
from kvstudy.precision.records import logp_path


def test_an_arm_is_done_when_ok_with_its_file_and_failed_ones_wait_for_retry(tmp_path: Path) -> None:
    states = {"model/bf16": "ok", "model/fp8": "failed"}
    assert simulate.arm_state(tmp_path, "model", "bf16", states) is None  # ok, but no log-p file
    assert needs_run(simulate.arm_state(tmp_path, "model", "bf16", states))
    write_jsonl_atomic(
        logp_path(tmp_path, "model", "bf16"), [{"id": "p0", "bucket": "gsm8k", "cluster": "c0", "logp": [-1.0]}]
    )
    assert logp_path(tmp_path, "model", "bf16").is_file()
    assert not needs_run(simulate.arm_state(tmp_path, "model", "bf16", states))
    assert not needs_run(simulate.arm_state(tmp_path, "model", "fp8", states))
    assert needs_run(simulate.arm_state(tmp_path, "model", "fp8", states), retry_failed=True)
    assert needs_run(simulate.arm_state(tmp_path, "model", "int8", states))  # never run


def test_kv_simulate_takes_retry_failed() -> None:
    args = cli.build_parser().parse_args(["kv-simulate", "somewhere", "--retry-failed"])
    assert args.retry_failed is True
