"""The report tables of paired verdicts, on hand-made records whose answers are known."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvstudy.accuracy import analysis as ga
from kvstudy.accuracy import paired
from kvstudy.accuracy import verdicts as vt
from kvstudy.accuracy.records import QuestionRecord, RetrievalRecord
from kvstudy.accuracy.runner import ConfigResult

ROOT = Path(__file__).resolve().parents[3]


def _questions(pattern: str, response: str = "#### 1") -> list[QuestionRecord]:
    return [QuestionRecord(i, f"h{i}", "1", response, "1", ch == "1", "1", ch == "1") for i, ch in enumerate(pattern)]


def _config(name: str, records: list, shots: int | None = 8, state: str = "ok") -> ConfigResult:
    return ConfigResult(name, name.upper(), state, None, shots, records, None)


def test_paired_verdicts_count_the_table_and_mark_the_control():
    base = "1111111100"
    results = {
        "bf16": _config("bf16", _questions(base)),
        "bf16-repeat": _config("bf16-repeat", _questions(base)),
        "fp8-kv": _config("fp8-kv", _questions("1111100010")),
        "bf16-zero-shot": _config("bf16-zero-shot", _questions("0000000000"), shots=0),
    }
    table, verdicts = vt.paired_verdicts(results, "bf16", "strict-match", 2.0, 0.99)
    assert list(table["configuration"]) == ["BF16-REPEAT", "FP8-KV"]  # zero-shot is not paired
    assert table.loc[0, "role"].startswith(vt.CONTROL_PREFIX) and table.loc[1, "role"] == "candidate"
    fp8 = verdicts[1]
    assert (fp8.counts.baseline_only, fp8.counts.candidate_only) == (3, 1)
    assert fp8.mcnemar_p == pytest.approx(paired.mcnemar_exact(3, 1))
    assert table.loc[1, "difference (points)"] == -20.0
    assert verdicts[0].counts.discordant == 0 and table.loc[0, "identical responses"] == "10/10"
    assert not table.loc[1, "non-inferior at 2 points"]  # 10 items cannot show it


def test_totals_table_gives_the_published_bounds():
    summary = ga.load_published(ROOT / "data" / "published" / "gsm8k-l4-qwen3-8b.json")
    table, bounds = vt.totals_table(summary)
    kv = dict(zip(table["configuration"], bounds))["FP8 KV cache"]
    assert kv.mcnemar_p_min == pytest.approx(0.0625)
    weights = dict(zip(table["configuration"], bounds))["FP8 weights"]
    assert weights.mcnemar_p_min == pytest.approx(0.03125)
    assert (weights.discordant_min, weights.discordant_max) == (6, 88)


def test_cut_off_counts_answers_at_the_limit():
    long, short = "x " * 300, "#### 1"
    results = {"a": _config("a", [*_questions("1", short), *_questions("0", long)])}
    words = vt.cut_off_table(results, 256, None)
    assert words.iloc[0, 2] == 1 and words.iloc[0, 3] == 1
    chars = vt.cut_off_table(results, 5, len)  # a counter in characters: both reach 5
    assert chars.iloc[0, 2] == 2


def _items(outcomes: dict[int, str], n_keys: int = 10) -> list[RetrievalRecord]:
    """Three items per context, two contexts per length; outcomes: length -> '1'/'0' per item."""
    records, doc = [], 0
    for length, pattern in outcomes.items():
        for i, ch in enumerate(pattern):
            records.append(
                RetrievalRecord(
                    doc,
                    f"kv-{length}-{i}",
                    "h",
                    "kv",
                    f"kv-{length}-{i // 3}",
                    length,
                    length,
                    0.5,
                    n_keys,
                    "12345",
                    " 12345" if ch == "1" else " 1",
                    "12345" if ch == "1" else "1",
                    ch == "1",
                )
            )
            doc += 1
    return records


def test_retrieval_accuracy_per_length_with_clusters():
    results = {"bf16": _config("bf16", _items({512: "111111", 1024: "111000"}), shots=0)}
    table = vt.retrieval_accuracy(results, "answer-line")
    assert list(table["context length (tokens)"]) == [512, 1024]
    assert list(table["correct"]) == [6, 3] and list(table["contexts"]) == [2, 2]
    # at 1024 tokens one context is all right, the other all wrong: clustering inflates the variance
    assert table.loc[1, "design effect"] > 1


def test_retrieval_paired_per_length_and_overall():
    results = {
        "bf16": _config("bf16", _items({512: "111111", 1024: "111111"}), shots=0),
        "fp8-kv": _config("fp8-kv", _items({512: "111111", 1024: "111000"}), shots=0),
    }
    table = vt.retrieval_paired(results, "bf16", "answer-line", 5.0)
    by_len = {row["context length (tokens)"]: row for _, row in table.iterrows()}
    assert by_len[512]["only this right"] == 0 and by_len[512]["difference (points)"] == 0
    assert by_len[1024]["only BF16 right"] == 3 and by_len[1024]["difference (points)"] == -50.0
    assert by_len["all"]["items"] == 12 and by_len["all"]["contexts"] == 4
    assert not by_len["all"]["non-inferior at 5 points"]


def test_chance_check_against_random_picks():
    good = _config("bf16", _items({512: "111111111111"}, n_keys=10), shots=0)
    bad = _config("bf16", _items({512: "100000000000"}, n_keys=10), shots=0)
    assert vt.chance_check(good, "answer-line")[0]
    ok, text = vt.chance_check(bad, "answer-line")
    assert not ok and "NOT" in text


def test_poisson_binomial_tail_is_exact():
    from itertools import product

    from scipy import stats as sps

    chances = [0.25, 0.25, 0.1, 0.5, 0.02]
    for right in range(len(chances) + 1):
        brute = sum(
            math.prod(q if hit else 1 - q for q, hit in zip(chances, hits))
            for hits in product([0, 1], repeat=len(chances))
            if sum(hits) >= right
        )
        assert vt.poisson_binomial_sf(right, chances) == pytest.approx(brute, abs=1e-12)
    # equal chances: the binomial tail
    assert vt.poisson_binomial_sf(22, [0.25] * 64) == pytest.approx(float(sps.binom.sf(21, 64, 0.25)), rel=1e-9)


def test_chance_check_uses_each_items_own_chance():
    """Items with many keys are nearly never right by chance: 8 of 24 right, 1.5 expected, passes,
    where one chance of 25 % for every item (the largest) would not (p about 0.3)."""
    mixed = _items({512: "1100"}, n_keys=4) + _items({1024: "11111100000000000000"}, n_keys=40)
    ok, text = vt.chance_check(_config("bf16", mixed, shots=0), "answer-line")
    assert ok and "Poisson-binomial" in text and "1.5 expected" in text


def test_share_margin_of_a_zero_baseline_is_not_a_verdict():
    results = {"bf16": _config("bf16", _questions("0000")), "bf16-repeat": _config("bf16-repeat", _questions("0000"))}
    table, _ = vt.paired_verdicts(results, "bf16", "strict-match", 2.0, 0.99)
    share = [c for c in table.columns if c.startswith("non-inferior at 99%")][0]
    assert table.loc[0, share] == "not defined (16-bit score 0)"
    # with a non-zero baseline the share margin is 1 % of its score and gives a yes/no verdict
    results = {"bf16": _config("bf16", _questions("1111")), "bf16-repeat": _config("bf16-repeat", _questions("1111"))}
    table, _ = vt.paired_verdicts(results, "bf16", "strict-match", 2.0, 0.99)
    share = [c for c in table.columns if c.startswith("non-inferior at 99%")][0]
    assert "(1.00 points)" in share and table.loc[0, share] in (True, False)


def test_no_interval_and_no_verdict_when_every_item_scored_alike():
    results = {
        "bf16": _config("bf16", _items({512: "000000"}), shots=0),
        "bf16-repeat": _config("bf16-repeat", _items({512: "000000"}), shots=0),
    }
    acc = vt.retrieval_accuracy(results, "answer-line")
    assert set(acc["clustered 95% %"]) == {vt.NO_VARIATION}
    table = vt.retrieval_paired(results, "bf16", "answer-line", 5.0)
    assert set(table["clustered 95% (points)"]) == {vt.NO_VARIATION}
    assert set(table["non-inferior at 5 points"]) == {"not judged (no variation)"}
