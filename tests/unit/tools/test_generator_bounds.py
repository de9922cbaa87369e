"""The generators refuse, in one line naming the option, a set too large to write in seconds (issue 35
item 4, issue 30's second corpus): each number and their product bounded (kvstudy.limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.tools import retrieval_data
from kvstudy.tools.retrieval_data import RetrievalSet, items_for


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
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    generated: list[Any] = []  # the refusal comes before any item is generated, so it takes no time
    monkeypatch.setattr(retrieval_data, "generate_items", lambda *a: generated.append(a) or [])
    assert cli.main(["retrieval-data", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert generated == [] and not (tmp_path / "out").exists()


def test_gsm8k_data_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gsm8k-data", str(tmp_path / "g"), "--n-test", "1000000000"]) == 2
    assert "argument --n-test: expected an integer from 1 to 1,000,000" in capsys.readouterr().err


class _CountedSearches(str):
    """A context that counts the searches made in it (a search per key is what made it quadratic)."""

    searches = 0

    def index(self, *args: Any) -> int:  # type: ignore[override]
        _CountedSearches.searches += 1
        return super().index(*args)

    def find(self, *args: Any) -> int:  # type: ignore[override]
        _CountedSearches.searches += 1
        return super().find(*args)

    def __contains__(self, key: Any) -> bool:
        _CountedSearches.searches += 1
        return super().__contains__(key)


def test_a_long_kv_context_is_placed_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Key places are found in one pass (a search per key made a 2 M-character kv context take minutes):
    the context is never searched key by key; each item's depth is still where its key first stands."""
    make_context, _CountedSearches.searches = retrieval_data.make_context, 0
    monkeypatch.setattr(
        retrieval_data, "make_context", lambda *a: (lambda c, e: (_CountedSearches(c), e))(*make_context(*a))
    )
    items = items_for(RetrievalSet(lengths=(20_000,), n_per_length=4, questions_per_context=4, kinds=("kv",)))
    assert items[0]["n_keys"] > 100 and _CountedSearches.searches == 0, _CountedSearches.searches
    monkeypatch.undo()
    for item in items + items_for(RetrievalSet(lengths=(300, 900), n_per_length=4, questions_per_context=1)):
        key = item["answer_prefix"].split()[-2 if item["kind"] == "needle" else 0].rstrip(":")
        assert item["depth"] == round(item["context"].index(key) / len(item["context"]), 4)
