"""The published context-scaling figures (seed 003) and what they imply.

``data/published/context-scaling.json`` holds the figures as the text prints them; this module
derives what follows from them, as data a notebook can show:

* the slope ratio FP8/BF16 and the reduction it is (a ratio of 54 % is a 46 % reduction);
* the fixed per-step cost of FP8 implied by a break-even length ``L*``: if
  ``ITL = a + b * L`` per arm and the arms cross at ``L*``, then ``a_fp8 - a_bf16 = (b_bf16 - b_fp8) * L*``;
  without absolute slopes it is given in "tokens of BF16 slope": ``(1 - ratio) * L*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.formats import per_token_time
from kvstudy.io import REPO_ROOT, read_json

DEFAULT_PATH = REPO_ROOT / "data" / "published" / "context-scaling.json"


@dataclass(frozen=True)
class SlopeFigure:
    """One published ITL-slope comparison, as printed."""

    id: str
    model: str
    gpu: str | None
    baseline: str
    candidate: str
    slope_baseline_ms_per_token: float | None
    slope_candidate_ms_per_token: float | None
    slope_ratio_printed_pct: float
    printed_wording: str
    break_even_tokens: int | None


@dataclass(frozen=True)
class SlopeDerivation:
    """What one slope figure implies."""

    id: str
    slope_ratio: float  # candidate / baseline (from absolute slopes when printed)
    slope_ratio_pct: float
    slope_reduction_pct: float  # (1 - ratio) x 100
    ratio_source: str  # "absolute slopes" or "printed ratio"
    slope_difference_ms_per_token: float | None
    fixed_cost_ms: float | None  # slope difference x break-even length
    fixed_cost_bf16_slope_tokens: float | None  # (1 - ratio) x break-even: the fixed cost in tokens of baseline slope
    statement: str


def load_published(path: str | Path | None = None) -> dict[str, Any]:
    """The published context-scaling file, checked to be labelled ``published``."""
    where = Path(path) if path is not None else DEFAULT_PATH
    data = read_json(where)
    if not isinstance(data, dict) or data.get("source") != "published":
        raise StudyError(f'{where}: expected an object with "source": "published"')
    for key in ("itl_slopes", "throughput_under_load"):
        if not isinstance(data.get(key), list):
            raise StudyError(f"{where}: field '{key}' must be a list")
    return data


def slope_figures(path: str | Path | None = None) -> list[SlopeFigure]:
    """The ITL-slope comparisons of the published file."""
    fields = SlopeFigure.__dataclass_fields__
    out = []
    for row in load_published(path)["itl_slopes"]:
        missing = [k for k in fields if k not in row]
        if missing:
            raise StudyError(f"context-scaling.json itl_slopes {row.get('id', '?')}: missing {', '.join(missing)}")
        out.append(SlopeFigure(**{k: row[k] for k in fields}))
    return out


def derive_slope(figure: SlopeFigure) -> SlopeDerivation:
    """Ratio, reduction and the fixed per-step FP8 cost implied by one slope figure."""
    base, cand = figure.slope_baseline_ms_per_token, figure.slope_candidate_ms_per_token
    if base is not None and cand is not None:
        if base <= 0:
            raise StudyError(f"{figure.id}: baseline slope {base!r} must be positive")
        ratio, source, diff = cand / base, "absolute slopes", base - cand
    else:
        ratio, source, diff = figure.slope_ratio_printed_pct / 100, "printed ratio", None
    length = figure.break_even_tokens
    fixed_ms = diff * length if diff is not None and length else None
    fixed_tokens = (1 - ratio) * length if length else None
    statement = (
        f"FP8's slope is {ratio * 100:.0f} % of the baseline's, a {(1 - ratio) * 100:.0f} % reduction "
        f"(the text says: {figure.printed_wording!r})"
    )
    if fixed_ms is not None:
        statement += (
            f"; break-even at {length:,} tokens implies a fixed FP8 cost of {fixed_ms:.3f} ms per step "
            f"({per_token_time(diff)} x {length:,})"
        )
    elif fixed_tokens is not None:
        statement += (
            f"; break-even at {length:,} tokens implies a fixed FP8 cost equal to {fixed_tokens:,.0f} "
            f"tokens of baseline ITL slope (no absolute slope printed)"
        )
    return SlopeDerivation(
        figure.id, ratio, ratio * 100, (1 - ratio) * 100, source, diff, fixed_ms, fixed_tokens, statement
    )


def derive_all(path: str | Path | None = None) -> list[SlopeDerivation]:
    """``derive_slope`` for every published slope figure."""
    return [derive_slope(f) for f in slope_figures(path)]


def published_table(path: str | Path | None = None) -> Any:
    """One row per slope figure: as printed and as derived (a pandas DataFrame)."""
    import pandas as pd

    rows = []
    for fig, der in zip(slope_figures(path), derive_all(path)):
        rows.append(
            {
                "id": fig.id,
                "model": fig.model,
                "gpu": fig.gpu,
                "candidate": fig.candidate,
                "slope bf16 (ms/token)": fig.slope_baseline_ms_per_token,
                "slope fp8 (ms/token)": fig.slope_candidate_ms_per_token,
                "printed ratio %": fig.slope_ratio_printed_pct,
                "ratio %": der.slope_ratio_pct,
                "reduction %": der.slope_reduction_pct,
                "break-even tokens": fig.break_even_tokens,
                "fixed FP8 cost (ms)": der.fixed_cost_ms,
                "fixed cost (tokens of bf16 slope)": der.fixed_cost_bf16_slope_tokens,
            }
        )
    return pd.DataFrame(rows).set_index("id")
