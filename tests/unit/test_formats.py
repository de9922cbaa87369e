"""kvstudy.formats: small numbers as a reader reads them, never in e-notation, values unchanged."""

from __future__ import annotations

import re

import pytest

from kvstudy import formats

E_NOTATION = re.compile(r"\d(?:\.\d+)?e[-+]?\d")


@pytest.mark.parametrize(
    ("value", "digits", "text"),
    [
        (4.37e-05, 3, "0.0000437"),
        (-8.07e-05, 3, "-0.0000807"),
        (14271.3, 3, "14,271"),
        (-0.0015, 3, "-0.0015"),
        (0.0676, 3, "0.0676"),
        (0.0009996, 3, "0.001"),
        (0.0, 3, "0"),
        (-4583.2, 3, "-4,583"),
        (3.913e-05, 4, "0.00003913"),
    ],
)
def test_significant_is_fixed_point(value: float, digits: int, text: str) -> None:
    assert formats.significant(value, digits) == text


@pytest.mark.parametrize("exponent", range(-12, 8))
@pytest.mark.parametrize("mantissa", [1.0, 2.31, -4.37, 9.996])
def test_no_magnitude_gives_e_notation_and_the_value_survives(mantissa: float, exponent: int) -> None:
    value = mantissa * 10.0**exponent
    text = formats.significant(value, 3)
    assert not E_NOTATION.search(text), text
    expected = float(f"{value:.3g}") if abs(value) < 1000 else round(value)  # integer digits are kept
    assert float(text.replace(",", "")) == pytest.approx(expected, rel=1e-9)
    for shown in (formats.per_token_time(value), formats.millinats(value), formats.logp_difference(value)):
        assert not E_NOTATION.search(shown), shown


def test_p_values() -> None:
    assert formats.p_value(2.31e-05) == "< 0.001"
    assert formats.p_value(0.000999) == "< 0.001"
    assert formats.p_value(0.001) == "0.001"
    assert formats.p_value(0.0676) == "0.0676" and formats.p_value(0.0676, 2) == "0.068"
    assert formats.p_value(1.0) == "1"
    assert formats.p_text(2.1e-54) == "p < 0.001" and formats.p_text(0.017) == "p = 0.017"
    assert formats.p_value(float("nan")) == formats.MISSING


def test_per_token_times_carry_their_unit() -> None:
    assert formats.per_token_time(4.37e-05) == "43.7 ns/token"
    assert formats.per_token_time(1.1e-03) == "1.1 µs/token"
    assert formats.per_token_time(0.0009996) == "1 µs/token"  # rounded first: not "1,000 ns/token"
    assert formats.per_token_time(0.25) == "250 µs/token"
    assert formats.per_token_time(2.5) == "2.5 ms/token"
    assert formats.per_token_interval(0.000829, 0.00162) == "0.829 .. 1.62 µs/token"


def test_log_p_differences_in_millinats_below_a_tenth_of_a_nat() -> None:
    assert formats.millinats(-4.41e-04, 3) == "-0.441"
    assert formats.logp_difference(-0.00044, -0.0008, -8.1e-05) == "-0.44 millinats/token (-0.8 to -0.081)"
    assert formats.logp_difference(-4.58, digits=3) == "-4.58 nats/token"
    assert formats.logp_difference(-0.02, -0.2, 0.05) == "-0.02 nats/token (-0.2 to +0.05)"
