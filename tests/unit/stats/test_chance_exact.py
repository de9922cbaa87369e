"""The retrieval chance check's p is exact far below the floating-point floor of 1 - cdf."""

from __future__ import annotations

import math

import pytest

from kvstudy.report.tables import chance_sentence
from kvstudy.stats import binary as stats


def test_tiny_chance_p_is_exact_not_the_float_floor() -> None:
    chances = [0.1] * 40
    p = stats.chance_check("BF16", [True] * 30 + [False] * 10, chances).p_value
    exact = sum(math.comb(40, k) * 0.1**k * 0.9 ** (40 - k) for k in range(30, 41))
    assert p == pytest.approx(exact, rel=1e-9) and p < 1e-20  # scipy's sf gives about 3e-16 here
    assert stats.chance_check("BF16", [False] * 40, chances).p_value == 1.0


def test_chance_sentence_prints_the_exact_value() -> None:
    c = stats.chance_check("BF16", [True] * 30 + [False] * 10, [0.1] * 40)
    text = chance_sentence(c)
    assert "3.3e-16" not in text and "Poisson-binomial p < 0.001" in text  # far below 0.001: said as such
