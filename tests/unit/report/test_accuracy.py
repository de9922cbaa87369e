"""kvstudy.report.tables: the column specs render records as the reports show them, and the
verdict sentences follow the numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvstudy.accuracy import verdicts as vt
from kvstudy.accuracy.runner import ConfigResult
from kvstudy.report import tables as rt
from kvstudy.report.tables import Column, Table, render
from kvstudy.stats import binary as stats
from kvstudy.stats import binary_power as totals

ROOT = Path(__file__).resolve().parents[3]
PUBLISHED = ROOT / "data" / "published" / "gsm8k-l4-qwen3-8b.json"
SPECS = [v for v in vars(rt).values() if isinstance(v, tuple) and v and all(isinstance(c, Column) for c in v)]


def outcomes(cells: tuple[int, int, int, int]) -> tuple[dict[int, bool], dict[int, bool]]:
    a, b, c, d = cells
    pairs = [(True, True)] * a + [(True, False)] * b + [(False, True)] * c + [(False, False)] * d
    return {i: x for i, (x, _) in enumerate(pairs)}, {i: y for i, (_, y) in enumerate(pairs)}


def test_every_column_names_key_header_unit_and_format() -> None:
    assert len(SPECS) >= 20
    for spec in SPECS:
        for col in spec:
            assert isinstance(col.key, str) and col.header and callable(col.format)
            assert col.unit in ("", "%", "points", "items", "tokens"), col
            assert ("{unit}" in col.header) <= bool(col.unit), col


def test_render_without_records_is_an_empty_frame() -> None:
    assert render([], rt.PAIRED).empty


def test_published_table_reproduces_the_intervals() -> None:
    table = render(vt.published_checks(vt.load_published(PUBLISHED)), rt.PUBLISHED)
    assert list(table.columns) == [
        "configuration",
        "correct",
        "accuracy %",
        "Wilson 95% (recomputed)",
        "Wilson 95% (published)",
        "matches to 0.1",
    ]
    assert list(table["correct"]) == ["459/500", "453/500", "454/500", "453/500"]
    assert list(table["accuracy %"]) == [91.8, 90.6, 90.8, 90.6]
    assert list(table["Wilson 95% (recomputed)"]) == ["89.1 to 93.9", "87.7 to 92.9", "87.9 to 93.0", "87.7 to 92.9"]
    assert table["matches to 0.1"].all()


def test_totals_table_and_sentences() -> None:
    rows = vt.totals_rows(vt.load_published(PUBLISHED))
    table = render(rows, rt.TOTALS).set_index("configuration")
    kv = table.loc["FP8 KV cache"]
    assert kv["correct"] == "454 vs 459 of 500"
    assert (kv["exact McNemar p, smallest possible"], kv["exact McNemar p, largest possible"]) == ("0.0625", "0.668")
    assert kv["runs disagree on (items)"] == "5 to 87" and kv["disagreement rate %"] == "1.0 to 17.4"
    assert kv["loss found with 80% power (points)"] == "1.6 to 5.4"
    assert kv["unpaired 95% interval (Newcombe, points)"] == "-4.5 to +2.5"
    by_name = {r.name: vt.totals_sentence(r.bounds) for r in rows}
    assert "cannot show a difference" in by_name["fp8-kv"] and "\u22121.0 points" in by_name["fp8-kv"]
    assert "between 0.0312 and" in by_name["fp8-weights"]
    assert "at none of these rates" in vt.totals_sentence(totals.totals_bounds(5, 3, 2))
    assert render([vt.TotalsRow("x", "small", totals.totals_bounds(5, 3, 2))], rt.TOTALS).iloc[0, 6] == "none"


def test_capture_and_guard_tables(acc) -> None:
    results = {
        "bf16": acc.config("bf16", acc.questions("1111111100")),
        "fp8-kv": ConfigResult(name="fp8-kv", label="FP8 KV cache", state="failed", diagnosis="fp8 not supported"),
        "random-weights": acc.config("random-weights", acc.questions("0000000000")),
    }
    capture = render(vt.capture_rows(results, "strict-match"), rt.CAPTURE)
    assert list(capture.columns) == ["configuration", "state", "shots", "correct", "accuracy %", "Wilson 95%"]
    assert list(capture["correct"]) == ["8/10", "", "0/10"] and capture.loc[0, "accuracy %"] == "80.0"
    assert "shots" not in render(vt.capture_rows(results, "strict-match"), rt.RETRIEVAL_CAPTURE)
    assert rt.failure_lines(results) == ["FP8 KV cache (failed): fp8 not supported"]
    guard = render(vt.guard_rows(results, "bf16"), rt.GUARD).set_index("configuration")
    assert guard.loc["FP8 KV cache", "intended change"] == "kv_cache_dtype"
    assert guard.loc["FP8 KV cache", "A/B guard"].startswith("no resolved record")
    assert guard.loc["RANDOM-WEIGHTS", "A/B guard"].startswith("not compared: another model")
    flagged = vt.GuardRow("x", ("kv_cache_dtype",), "yes", ("seed: 0 -> 1",))
    clean = vt.GuardRow("y", ("kv_cache_dtype",), "yes")
    assert list(render([flagged, clean], rt.GUARD)["A/B guard"]) == [
        "FLAGGED: also seed: 0 -> 1",
        "clean: only the intended change",
    ]


def test_paired_table_headers_follow_the_records(acc) -> None:
    base = "1111111100"
    results = {
        "bf16": acc.config("bf16", acc.questions(base)),
        "bf16-repeat": acc.config("bf16-repeat", acc.questions(base)),
        "fp8-kv": acc.config("fp8-kv", acc.questions("1111100010")),
    }
    table = render(vt.paired_rows(results, "bf16", "strict-match", 2.0, 0.99), rt.PAIRED)
    assert list(table.columns) == [
        "configuration",
        "role",
        "items",
        "BF16 right",
        "this right",
        "only BF16 right",
        "only this right",
        "difference (points)",
        "exact McNemar p",
        "95% interval (Newcombe, points)",
        "non-inferior at 2 points",
        "non-inferior at 99% of BF16 (0.80 points)",
        "identical responses",
    ]
    assert list(table["role"]) == [rt.CONTROL_PREFIX + " (16-bit again)", "candidate"]
    assert table.loc[1, "difference (points)"] == -20.0 and table.loc[1, "exact McNemar p"] == "0.625"
    assert table.loc[0, "identical responses"] == "10/10" and not table.loc[1, "non-inferior at 2 points"]
    zero = {
        "bf16": acc.config("bf16", acc.questions("0000")),
        "bf16-repeat": acc.config("bf16-repeat", acc.questions("0000")),
    }
    shown = render(vt.paired_rows(zero, "bf16", "strict-match", 2.0, 0.99), rt.PAIRED)
    assert shown.loc[0, "non-inferior at 99% of BF16 (0.00 points)"] == "not defined (16-bit score 0)"


def test_paired_sentences_follow_the_numbers() -> None:
    ok = stats.compare(*outcomes((450, 4, 3, 43)), margin_points=2.0)
    text = vt.paired_sentence(ok)
    assert "Non-inferior at a margin of 2.00 points" in text
    assert "no difference" in text and "not proof" in text
    loss = stats.compare(
        *outcomes((400, 30, 5, 65)), margin_points=1.0, candidate_label="FP8 KV", baseline_label="BF16"
    )
    text = vt.paired_sentence(loss)
    assert "FP8 KV scoring lower than BF16" in text and "is not shown" in text
    assert "exactly the same" in vt.paired_sentence(stats.compare(*outcomes((450, 0, 0, 50)), margin_points=1.0))
    for cells in [(450, 4, 3, 43), (400, 30, 5, 65), (450, 0, 0, 50), (300, 2, 20, 178)]:
        words = vt.paired_sentence(stats.compare(*outcomes(cells), margin_points=1.0)).lower()
        assert "overlap" not in words and "wilson" not in words  # overlap is never used as a test


def test_discrimination_and_chance_sentences() -> None:
    strong = {i: i < 30 for i in range(40)}
    weak = {i: i >= 38 for i in range(40)}
    assert "discriminates" in rt.discrimination_sentence(stats.discrimination_check("8-shot", strong, "0-shot", weak))
    none = {i: False for i in range(40)}
    floor = rt.discrimination_sentence(stats.discrimination_check("8-shot", none, "0-shot", none))
    assert "cannot discriminate" in floor
    good = stats.chance_check("BF16", [True] * 8 + [False] * 16, [0.25] * 4 + [1 / 40] * 20)
    assert "retrieves better than chance" in rt.chance_sentence(good) and "1.5 expected" in rt.chance_sentence(good)
    bad = stats.chance_check("BF16", [True] + [False] * 11, [0.1] * 12)
    assert "does NOT retrieve" in rt.chance_sentence(bad) and "Poisson-binomial" in rt.chance_sentence(bad)
    assert rt.chance_sentence(stats.chance_check("BF16", [], [])) == "BF16: no retrieval records."


def test_retrieval_tables_and_sentence(acc) -> None:
    results = {
        "bf16": acc.config("bf16", acc.items({512: "111111", 1024: "111111", 2048: "000000"}), shots=0),
        "fp8-kv": acc.config("fp8-kv", acc.items({512: "111111", 1024: "111000", 2048: "000000"}), shots=0),
    }
    acc = render(vt.retrieval_accuracy(results, "answer-line"), rt.RETRIEVAL_ACCURACY)
    assert list(acc.columns) == [
        "configuration",
        "context length (tokens)",
        "items",
        "contexts",
        "correct",
        "accuracy %",
        "clustered 95% %",
        "design effect",
        "Wilson 95% % (ignores clusters)",
    ]
    fp8 = acc[acc["configuration"] == "FP8-KV"].set_index("context length (tokens)")
    assert (
        fp8.loc[1024, "clustered 95% %"].startswith("0 to 100: uninformative (") and fp8.loc[1024, "accuracy %"] == 50.0
    )
    assert fp8.loc[2048, "clustered 95% %"] == rt.NO_VARIATION_ACCURACY and pd.isna(fp8.loc[2048, "design effect"])
    by_kind = render(vt.retrieval_accuracy(results, "answer-line", by_kind=True), rt.RETRIEVAL_ACCURACY_BY_KIND)
    assert list(by_kind.columns)[:3] == ["configuration", "kind", "context length (tokens)"]
    assert "Wilson 95% % (ignores clusters)" not in by_kind
    rows = vt.retrieval_paired(results, "bf16", "answer-line", 5.0)
    paired = render(rows, rt.RETRIEVAL_PAIRED).set_index("context length (tokens)")
    assert paired.loc[1024, "only BF16 right"] == 3 and paired.loc[1024, "difference (points)"] == -50.0
    assert paired.loc[2048, "clustered 95% (points)"] == rt.NO_VARIATION
    assert paired.loc[2048, "non-inferior at 5 points"] == "not judged (no variation)"
    assert not paired.loc["all", "non-inferior at 5 points"] and paired.loc["all", "contexts"] == 6
    text = rt.retrieval_sentence(rows)
    assert text.startswith("FP8-KV: -16.7 points over all lengths (clustered 95% ")
    assert "exact McNemar p = 0.25; non-inferiority not shown at 5 points." in text
    assert text.endswith(
        "At no single context length does the paired test show a difference at the 5% level "
        "(Holm over the 3 per-length tests)."
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(len(s)))
def test_headers_are_unique(spec: Table) -> None:
    headers = [c.header for c in spec]
    assert len(headers) == len(set(headers))
