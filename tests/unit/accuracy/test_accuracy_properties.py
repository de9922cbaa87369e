"""Property-based tests (hypothesis) for the totals bounds and the lm-eval sample reader."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st

from kvstudy.accuracy import records as smp  # noqa: E402
from kvstudy.errors import StudyError  # noqa: E402
from kvstudy.stats import binary as stats  # noqa: E402
from kvstudy.stats import binary_power as totals  # noqa: E402

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def item_totals(draw: st.DrawFn, n_max: int = 40) -> tuple[int, int, int]:
    n = draw(st.integers(1, n_max))
    return n, draw(st.integers(0, n)), draw(st.integers(0, n))


@FAST
@given(item_totals())
def test_totals_bounds_match_every_pairing(t: tuple[int, int, int]) -> None:
    n, a, b = t
    tables = [(a - both, b - both) for both in range(n + 1) if min(a - both, b - both, n - a - b + both) >= 0]
    ps = [stats.mcnemar_exact(x, y) for x, y in tables]
    bounds = totals.totals_bounds(n, a, b)
    assert bounds.mcnemar_p_min == pytest.approx(min(ps))
    assert bounds.mcnemar_p_max == pytest.approx(max(ps))
    assert (bounds.discordant_min, bounds.discordant_max) == (
        min(x + y for x, y in tables),
        max(x + y for x, y in tables),
    )
    # the smallest p: every disagreement one way, as few as the totals allow
    assert bounds.mcnemar_p_min == pytest.approx(min(1.0, 2 * 0.5 ** abs(a - b)))
    assert 0 < bounds.mcnemar_p_min <= bounds.mcnemar_p_max <= 1
    assert bounds.unpaired.low <= (b - a) / n <= bounds.unpaired.high
    if bounds.detectable_loss_high is not None:
        assert bounds.detectable_loss_low <= bounds.detectable_loss_high
        assert bounds.detectable_loss_high <= bounds.disagreement_max + 1e-9


@FAST
@given(item_totals(n_max=300))
def test_totals_are_symmetric_in_the_two_runs(t: tuple[int, int, int]) -> None:
    n, a, b = t
    one, other = totals.totals_bounds(n, a, b), totals.totals_bounds(n, b, a)
    assert (one.mcnemar_p_min, one.mcnemar_p_max) == pytest.approx((other.mcnemar_p_min, other.mcnemar_p_max))
    assert (one.discordant_min, one.discordant_max) == (other.discordant_min, other.discordant_max)
    assert (one.unpaired.low, one.unpaired.high) == pytest.approx((-other.unpaired.high, -other.unpaired.low), abs=1e-9)


@FAST
@given(st.integers(-5, 5), st.integers(-5, 5), st.integers(-5, 5))
def test_totals_refuse_impossible_counts(n: int, a: int, b: int) -> None:
    if n > 0 and 0 <= a <= n and 0 <= b <= n:
        totals.totals_bounds(n, a, b)
    else:
        with pytest.raises(StudyError):
            totals.totals_bounds(n, a, b)


outcome_maps = st.dictionaries(st.integers(0, 400), st.booleans(), min_size=1, max_size=40)
odd_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30)


@FAST
@given(base=outcome_maps, flips=st.sets(st.integers(0, 400)), seed=st.integers(0, 2**16), question=odd_text)
def test_reader_pairs_any_order_and_any_document_text(
    lmeval: SimpleNamespace, base: dict[int, bool], flips: set[int], seed: int, question: str
) -> None:
    cand = {k: v != (k in flips) for k, v in base.items()}
    # document text with line separators lm-eval writes unescaped (U+2028, U+0085) and the like
    doc = {"question": question + "\u2028\x85", "answer": "#### 1"}
    with tempfile.TemporaryDirectory() as folder:
        rows_b = lmeval.rows_for(base, doc=doc)
        rows_c = lmeval.rows_for(cand, doc=doc)
        random.Random(seed).shuffle(rows_c)
        path_b = lmeval.write_rows(Path(folder) / "a" / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows_b)
        path_c = lmeval.write_rows(Path(folder) / "b" / f"samples_gsm8k_{lmeval.DATE}.jsonl", rows_c)
        for name in lmeval.FILTERS:
            pair = smp.read_pair(path_b, path_c, filter_name=name)
            assert pair.baseline.correctness() == base and pair.candidate.correctness() == cand
            assert pair.doc_ids == tuple(sorted(base))
            assert stats.paired_counts(
                pair.baseline.correctness(), pair.candidate.correctness()
            ) == stats.paired_counts(base, cand)


@FAST
@given(base=outcome_maps, junk=st.text(max_size=20), where=st.integers(0, 10_000))
def test_reader_reports_a_bad_line_by_number(
    lmeval: SimpleNamespace, base: dict[int, bool], junk: str, where: int
) -> None:
    junk = junk.replace("\n", " ")
    try:
        value = json.loads(junk)
    except ValueError:
        value = None
    if not junk.strip() or (isinstance(value, dict) and "doc_id" in value and "filter" in value):
        return  # blank lines are skipped; a row-shaped object is not junk
    lines = [json.dumps(r, ensure_ascii=False) for r in lmeval.rows_for(base)]
    at = where % (len(lines) + 1)
    lines.insert(at, junk)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"samples_gsm8k_{lmeval.DATE}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(StudyError) as exc:
            smp.read_samples(path)
    assert str(exc.value).startswith(f"{path}:{at + 1}: ")
