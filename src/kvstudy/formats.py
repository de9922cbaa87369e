"""Numbers as a reader reads them: fixed-point significant digits (never ``4.37e-05``), per-token
times in ns/µs/ms, log-probability differences in millinats, p-values as ``p < 0.001`` or 2-3
digits. The one place reports (tables, prose, the verdict card) format small numbers; CSVs keep
the full values."""

from __future__ import annotations

import math
from typing import Any

GIB = 2**30  # bytes in a GiB, the unit vLLM, drivers and the catalog give memory in
MISSING = "–"  # a value that does not exist
P_FLOOR = 0.001  # p-values below it are shown as "< 0.001"
_TIME_UNITS = (("ms", 1.0), ("µs", 1e-3), ("ns", 1e-6))  # name, size in ms


def significant(value: float | None, digits: int = 3, sign: bool = False) -> str:
    """``value`` to ``digits`` significant digits in fixed point: ``4.37e-05`` -> ``0.0000437``,
    ``14271.3`` -> ``14,271`` (never fewer digits than the integer part); trailing zeros dropped;
    ``sign`` writes ``+`` before a positive value."""
    if value is None or value != value:
        return MISSING
    number = float(value)
    if not math.isfinite(number):
        return str(number)
    plus = "+" if sign and number > 0 else ""
    if number == 0:
        return "0"
    exponent = math.floor(math.log10(abs(float(f"{number:.{digits}g}"))))
    decimals = max(0, digits - 1 - exponent)
    text = f"{number:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return plus + ("0" if text in ("-0", "") else text)


def finite(value: Any) -> Any:
    """``value`` as strict JSON holds it: NaN and infinities become None (JSON has neither), containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def p_value(p: float | None, digits: int = 3) -> str:
    """``< 0.001`` below 0.001, else ``digits`` significant digits (``0.0676``, ``0.419``, ``1``)."""
    return f"< {P_FLOOR:g}" if p is not None and p < P_FLOOR else significant(p, digits)  # NaN: not below


def p_text(p: float | None, digits: int = 3) -> str:
    """``p = 0.017`` or ``p < 0.001``, for prose."""
    shown = p_value(p, digits)
    return f"p {shown}" if shown.startswith("<") else f"p = {shown}"


def per_token_time(ms_per_token: float | None, digits: int = 3) -> str:
    """A time per token of context, given in ms, in the unit that puts it at 1 or above:
    ``4.37e-05`` -> ``43.7 ns/token``, ``1.1e-03`` -> ``1.1 µs/token``."""
    if ms_per_token is None or ms_per_token != ms_per_token:
        return MISSING
    rounded = abs(float(f"{ms_per_token:.{digits}g}"))  # 0.0009996 ms is 1 µs, not 1,000 ns
    name, size = next(((n, s) for n, s in _TIME_UNITS if rounded >= s), _TIME_UNITS[-1])
    return f"{significant(ms_per_token / size, digits)} {name}/token"


def per_token_interval(low: float | None, high: float | None, digits: int = 3) -> str:
    """An interval of times per token given in ms, both ends in the unit of the larger one:
    ``(9.2e-04, 1.3e-03)`` -> ``0.92 .. 1.3 µs/token``."""
    if low is None or high is None or low != low or high != high:
        return MISSING
    unit = per_token_time(max(abs(low), abs(high)), digits).split(" ", 1)[1]
    size = {f"{n}/token": s for n, s in _TIME_UNITS}[unit]
    return f"{significant(low / size, digits)} .. {significant(high / size, digits)} {unit}"


def millinats(nats: float | None, digits: int = 2, sign: bool = True) -> str:
    """A log-probability difference given in nats, in millinats (no unit): ``-4.41e-04`` -> ``-0.44``."""
    return significant(None if nats is None else nats * 1000.0, digits, sign=sign)


def logp_difference(mean: float | None, low: float | None = None, high: float | None = None, digits: int = 2) -> str:
    """A mean Δ log p given in nats per token, with its interval when given, in nats/token when its
    largest magnitude reaches 0.1 nat, else millinats/token: ``-0.00044 (-0.0008 to -8.1e-05)`` ->
    ``-0.44 millinats/token (-0.8 to -0.081)``; ``-4.58`` -> ``-4.58 nats/token``."""
    if mean is None or mean != mean:
        return MISSING
    values = [v for v in (mean, low, high) if v is not None and v == v]
    scale, unit = (1.0, "nats/token") if max(abs(v) for v in values) >= 0.1 else (1000.0, "millinats/token")
    text = f"{significant(mean * scale, digits, sign=True)} {unit}"
    if low is not None and high is not None:
        text += f" ({significant(low * scale, digits, sign=True)} to {significant(high * scale, digits, sign=True)})"
    return text
