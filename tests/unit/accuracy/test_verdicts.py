"""The records of paired verdicts (kvstudy.accuracy.verdicts), on hand-made records whose answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.accuracy import verdicts as vt
from kvstudy.errors import StudyError
from kvstudy.stats import binary as stats

ROOT = Path(__file__).resolve().parents[3]


def test_paired_rows_count_the_table_and_mark_the_control(acc):
    base = "1111111100"
    results = {
        "bf16": acc.config("bf16", acc.questions(base)),
        "bf16-repeat": acc.config("bf16-repeat", acc.questions(base)),
        "fp8-kv": acc.config("fp8-kv", acc.questions("1111100010")),
        "bf16-zero-shot": acc.config("bf16-zero-shot", acc.questions("0000000000"), shots=0),
    }
    rows = vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)
    assert [r.label for r in rows] == ["BF16-REPEAT", "FP8-KV"]  # zero-shot is not paired
    assert [r.control for r in rows] == [True, False]
    fp8 = rows[1].comparison
    assert (fp8.baseline, fp8.candidate) == ("BF16", "FP8-KV")
    assert (fp8.counts.baseline_only, fp8.counts.candidate_only) == (3, 1)
    assert fp8.mcnemar_p == pytest.approx(stats.mcnemar_exact(3, 1))
    assert fp8.difference == pytest.approx(-0.2)
    assert rows[0].comparison.counts.discordant == 0 and rows[0].identical_responses == 10
    assert fp8.non_inferiority.non_inferior is False  # 10 items cannot show it
    assert rows[1].by_share.margin == pytest.approx(0.01 * 0.8) and rows[1].by_share.share == 0.99


def test_paired_rows_need_a_finished_baseline(acc):
    results = {"bf16": acc.config("bf16", [], state="failed"), "fp8-kv": acc.config("fp8-kv", acc.questions("1"))}
    with pytest.raises(StudyError, match="no finished records"):
        vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)


def test_totals_rows_give_the_published_bounds():
    summary = vt.load_published(ROOT / "data" / "published" / "gsm8k-l4-qwen3-8b.json")
    rows = {r.name: r for r in vt.totals_rows(summary)}
    assert list(rows) == ["fp8-weights", "fp8-kv", "fp8-weights-fp8-kv"]  # the baseline is left out
    kv = rows["fp8-kv"].bounds
    assert kv.mcnemar_p_min == pytest.approx(0.0625) and (kv.baseline, kv.candidate, kv.n) == (459, 454, 500)
    weights = rows["fp8-weights"].bounds
    assert weights.mcnemar_p_min == pytest.approx(0.03125)
    assert (weights.discordant_min, weights.discordant_max) == (6, 88)


def test_cut_off_counts_answers_at_the_limit(acc):
    long, short = "x " * 300, "#### 1"
    results = {"a": acc.config("a", [*acc.questions("1", short), *acc.questions("0", long)])}
    (words,) = vt.cut_off_rows(results, 256, None)
    assert (words.answers, words.reached, words.wrong) == (2, 1, 1)
    assert words.measure == "words (a lower bound)" and words.limit == 256
    (chars,) = vt.cut_off_rows(results, 5, len)  # a counter in characters: both reach 5
    assert chars.reached == 2 and chars.measure == "tokens (model tokenizer)"


def test_retrieval_accuracy_per_length_with_clusters(acc):
    results = {"bf16": acc.config("bf16", acc.items({512: "111111", 1024: "111000"}), shots=0)}
    rows = vt.retrieval_accuracy(results, "answer-line")
    assert [r.length for r in rows] == [512, 1024] and {r.kind for r in rows} == {"all"}
    assert [r.correct for r in rows] == [6, 3] and [r.contexts for r in rows] == [2, 2]
    assert rows[0].interval is None  # every item right: no interval of width 0
    # at 1024 tokens one context is all right, the other all wrong: clustering inflates the variance
    at_1024 = rows[1]
    assert at_1024.clustered is not None and at_1024.clustered.design_effect > 1
    assert at_1024.accuracy == 0.5 and at_1024.interval == (0.0, 1.0)  # clipped to [0, 1]
    assert (at_1024.wilson.correct, at_1024.wilson.n) == (3, 6)
    by_kind = vt.retrieval_accuracy(results, "answer-line", by_kind=True)
    assert {r.kind for r in by_kind} == {"kv"}


def test_retrieval_paired_per_length_and_overall(acc):
    results = {
        "bf16": acc.config("bf16", acc.items({512: "111111", 1024: "111111"}), shots=0),
        "fp8-kv": acc.config("fp8-kv", acc.items({512: "111111", 1024: "111000"}), shots=0),
    }
    by_len = {r.length: r for r in vt.retrieval_paired(results, "bf16", "answer-line", 5.0)}
    assert by_len[512].counts.candidate_only == 0 and by_len[512].clustered.mean == 0
    assert by_len[1024].counts.baseline_only == 3 and by_len[1024].clustered.mean == pytest.approx(-0.5)
    overall = by_len[None]
    assert overall.counts.n == 12 and overall.clustered.clusters == 4 and overall.baseline == "BF16"
    assert overall.mcnemar_p == pytest.approx(stats.mcnemar_exact(3, 0))
    assert overall.non_inferiority.non_inferior is False and overall.non_inferiority.margin == pytest.approx(0.05)


def test_chance_check_against_random_picks(acc):
    good = acc.config("bf16", acc.items({512: "111111111111"}, n_keys=10), shots=0)
    bad = acc.config("bf16", acc.items({512: "100000000000"}, n_keys=10), shots=0)
    assert vt.chance_check(good, "answer-line").better_than_chance
    low = vt.chance_check(bad, "answer-line")
    assert not low.better_than_chance and (low.right, low.n, low.label) == (1, 12, "BF16")
    assert low.expected == pytest.approx(1.2)


def test_chance_check_uses_each_items_own_chance(acc):
    """Items with many keys are nearly never right by chance: 8 of 24 right, 1.5 expected, passes,
    where one chance of 25 % for every item (the largest) would not (p about 0.3)."""
    mixed = acc.items({512: "1100"}, n_keys=4) + acc.items({1024: "11111100000000000000"}, n_keys=40)
    c = vt.chance_check(acc.config("bf16", mixed, shots=0), "answer-line")
    assert c.better_than_chance and c.expected == pytest.approx(1.5)
    assert (c.chance_min, c.chance_max) == (1 / 40, 1 / 4)


def test_share_margin_of_a_zero_baseline_is_not_judged(acc):
    results = {
        "bf16": acc.config("bf16", acc.questions("0000")),
        "bf16-repeat": acc.config("bf16-repeat", acc.questions("0000")),
    }
    (row,) = vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)
    assert row.by_share.margin == 0 and row.by_share.non_inferior is None
    # with a non-zero baseline the share margin is 1 % of its score and gives a yes/no verdict
    results = {
        "bf16": acc.config("bf16", acc.questions("1111")),
        "bf16-repeat": acc.config("bf16-repeat", acc.questions("1111")),
    }
    (row,) = vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99)
    assert row.by_share.margin_points == pytest.approx(1.0) and row.by_share.non_inferior in (True, False)


def test_no_interval_and_no_verdict_when_every_item_scored_alike(acc):
    results = {
        "bf16": acc.config("bf16", acc.items({512: "000000"}), shots=0),
        "bf16-repeat": acc.config("bf16-repeat", acc.items({512: "000000"}), shots=0),
    }
    assert [r.interval for r in vt.retrieval_accuracy(results, "answer-line")] == [None, None]
    rows = vt.retrieval_paired(results, "bf16", "answer-line", 5.0)
    assert all(not r.clustered.varies and r.non_inferiority.non_inferior is None for r in rows)
    assert all(r.control for r in rows)


def test_detectable_loss_at_the_observed_disagreement_and_at_best() -> None:
    from kvstudy.stats import binary_power as totals

    seen = vt.detectable_loss(100, 12)
    assert seen.points == pytest.approx(100 * (totals.smallest_detectable_loss(100, 0.12) or 0))
    assert "observed disagreement of 12.0 %" in seen.basis and "80 % power" in seen.sentence()
    none = vt.detectable_loss(100, 0)  # never disagreeing: at best, every disagreement against the candidate
    assert none.points is not None and 5 < none.points < 15 and "never disagree" in none.basis
    assert vt.detectable_loss(3, 1).points is None  # three items: no loss of any size at 80 % power
    assert "lower bound" in vt.detectable_loss(64, 4, clustered=True).basis


def test_holm_of_a_family() -> None:
    from kvstudy.stats.binary import holm

    # notebook 07's case: p = 0.017 and 0.040 among 22 tests pass no longer
    adjusted = holm([0.017, 0.040] + [0.5] * 20)
    assert adjusted[0] == pytest.approx(0.374) and adjusted[1] == pytest.approx(0.84)
    assert holm([]) == []
