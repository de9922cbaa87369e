"""The generators refuse, in one line naming the option, a set too large to write in seconds (issue 35
item 4, issue 30's second corpus): each number and their product bounded (kvstudy.limits)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvstudy import cli
from kvstudy.tools.retrieval_files import RetrievalSet, items_for


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "16,2000000000"], "--lengths: expected whole numbers from 16 to 10,000,000"),
        (["--n-per-length", "1000000"], "--lengths x --n-per-length x --chars-per-token: 2 kinds x 1,000,000 items"),
        (["--chars-per-token", "100000", "--lengths", "100000"], "expected at most 134,217,728 in one file"),
        (["--n-needles", "0"], "argument --n-needles: expected an integer from 1"),
        (["--n-per-length", "6"], "--n-per-length (6) must be a multiple of --questions-per-context (4)"),
    ],
)
def test_retrieval_data_bounds_each_number_and_the_product(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert cli.main(["retrieval-data", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert time.monotonic() - started < 10 and not (tmp_path / "out").exists()


def test_gsm8k_data_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gsm8k-data", str(tmp_path / "g"), "--n-test", "1000000000"]) == 2
    assert "argument --n-test: expected an integer from 1 to 1,000,000" in capsys.readouterr().err


def test_a_long_kv_context_is_placed_in_one_pass() -> None:
    """Key places are found in one pass (a search per key made a 2 M-character kv context take minutes);
    each item's depth is still where its key first stands."""
    started = time.monotonic()
    items = items_for(RetrievalSet(lengths=(2_000_000,), n_per_length=4, questions_per_context=4, kinds=("kv",)))
    assert time.monotonic() - started < 20
    for item in items + items_for(RetrievalSet(lengths=(300, 900), n_per_length=4, questions_per_context=1)):
        key = item["answer_prefix"].split()[-2 if item["kind"] == "needle" else 0].rstrip(":")
        assert item["depth"] == round(item["context"].index(key) / len(item["context"]), 4)
