"""The roofline's predictions set beside the published figures (seed 003) and beside a live fit.

Each row says where each value comes from: "published (seed 003)", "predicted (roofline)",
"derived" (arithmetic on published figures), "measured" (a live capture). The roofline reads KV
bytes only, with no fixed per-step FP8 cost, so it predicts a slope ratio of exactly 0.5 for any
layer whose KV is stored in FP8 and a break-even length of 0 (FP8 never slower); what the published
figures show beyond that (a ratio above 0.5, a break-even of thousands of tokens) is the cost the
roofline leaves out, and the tables state that gap as a figure.

``data/published/context-scaling.json`` holds the published figures as the text prints them; this
module derives what follows from them, as data a notebook can show:

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
from kvstudy.gpu_catalog import find_gpu
from kvstudy.io import REPO_ROOT, read_json
from kvstudy.model.roofline import max_fp8_gain_pct, predicted_slope_ms_per_token

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

    figure: SlopeFigure
    slope_ratio: float  # candidate / baseline (from absolute slopes when printed)
    slope_ratio_pct: float
    slope_reduction_pct: float  # (1 - ratio) x 100
    ratio_source: str  # "absolute slopes" or "printed ratio"
    slope_difference_ms_per_token: float | None
    fixed_cost_ms: float | None  # slope difference x break-even length
    fixed_cost_bf16_slope_tokens: float | None  # (1 - ratio) x break-even: the fixed cost in tokens of baseline slope
    statement: str

    @property
    def id(self) -> str:
        return self.figure.id


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
    try:
        return [
            SlopeFigure(**{k: row[k] for k in SlopeFigure.__dataclass_fields__})
            for row in load_published(path)["itl_slopes"]
        ]
    except KeyError as exc:
        raise StudyError(f"context-scaling.json itl_slopes: a figure lacks the field {exc}") from None


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
        figure, ratio, ratio * 100, (1 - ratio) * 100, source, diff, fixed_ms, fixed_tokens, statement
    )


def derive_all(path: str | Path | None = None) -> list[SlopeDerivation]:
    """``derive_slope`` for every published slope figure."""
    return [derive_slope(f) for f in slope_figures(path)]


# --------------------------------------------------------------------------- the roofline beside them

PUBLISHED = "published (seed 003)"
DERIVED = "derived from published figures"

# What each row of published_vs_roofline states (its quantity).
BF16_SLOPE = "BF16 ITL slope (ms/token)"
FP8_SLOPE = "FP8 ITL slope (ms/token)"
SLOPE_RATIO = "slope ratio FP8/BF16"
BREAK_EVEN = "break-even context (tokens)"
FIXED_COST_MS = "implied fixed FP8 cost per step (ms)"
FIXED_COST_TOKENS = "implied fixed FP8 cost (tokens of BF16 slope)"
THROUGHPUT_GAIN = "output throughput gain (%)"


@dataclass(frozen=True)
class RooflineRow:
    """One published figure beside the roofline's value for it."""

    figure: str
    quantity: str  # one of the quantities above
    published: float | None
    roofline: float
    assumed: str  # what the text does not give and the prediction had to assume
    basis: str  # what the roofline's value rests on
    published_origin: str = PUBLISHED

    @property
    def gap(self) -> float | None:
        """published / roofline (None when either is missing or the roofline is 0)."""
        return self.published / self.roofline if self.published is not None and self.roofline else None


def _folder(models_root: str | Path, hub_id: str) -> str:
    """The model folder where the roofline evaluates a published figure of ``hub_id``."""
    folder = Path(models_root) / hub_id.split("/")[-1]
    if not (folder / "config.json").is_file():
        raise StudyError(f"{folder}/config.json: not found (the roofline needs the config of {hub_id})")
    return str(folder)


def published_vs_roofline(
    models_root: str | Path,
    bandwidth_factor: float = 1.0,
    assumed_gpu: str = "H100-SXM",
    path: str | Path | None = None,
) -> list[RooflineRow]:
    """One row per published context-scaling figure: the value as printed, the roofline's, and the gap.

    ``bandwidth_factor`` 1.0 (peak) by default: the roofline's default 0.9 was itself read off the
    H100 slope, so using it here would predict that slope from itself.
    """
    rows: list[RooflineRow] = []
    for der in derive_all(path):
        fig = der.figure
        folder, gpu = _folder(models_root, fig.model), find_gpu(fig.gpu or assumed_gpu)
        assumed = "" if fig.gpu else f"GPU not given by the text; {assumed_gpu} assumed"
        skip = "sliding_window" if "skip-layers sliding_window" in fig.candidate else None
        pb = predicted_slope_ms_per_token(folder, "bfloat16", gpu.bandwidth_gb_s, bandwidth_factor)
        pc = predicted_slope_ms_per_token(folder, "fp8", gpu.bandwidth_gb_s, bandwidth_factor, skip_layers=skip)
        peak = f"at {gpu.name} peak x {bandwidth_factor:g}"

        def add(quantity: str, published: float | None, roofline: float, basis: str, origin: str = PUBLISHED) -> None:
            rows.append(RooflineRow(fig.id, quantity, published, roofline, assumed, basis, origin))  # noqa: B023

        if fig.slope_baseline_ms_per_token is not None:
            add(BF16_SLOPE, fig.slope_baseline_ms_per_token, pb, peak)
            add(FP8_SLOPE, fig.slope_candidate_ms_per_token, pc, peak)
        basis = "KV bytes per token halved" + (" in full-attention layers" if skip else "")
        absolute = der.ratio_source != "printed ratio"
        add(SLOPE_RATIO, der.slope_ratio, pc / pb, basis, f"{DERIVED} (absolute slopes)" if absolute else PUBLISHED)
        if fig.break_even_tokens is not None:
            add(BREAK_EVEN, float(fig.break_even_tokens), 0.0, "no fixed FP8 cost in the roofline: FP8 is never slower")
        if der.fixed_cost_ms is not None:
            add(FIXED_COST_MS, der.fixed_cost_ms, 0.0, "slope difference x break-even length", DERIVED)
        elif der.fixed_cost_bf16_slope_tokens is not None:
            add(FIXED_COST_TOKENS, der.fixed_cost_bf16_slope_tokens, 0.0, "(1 - ratio) x break-even length", DERIVED)
    for item in load_published(path)["throughput_under_load"]:
        skip = "sliding_window" if "sliding_window" in item["candidate"] else None
        folder = _folder(models_root, item["model"])
        gain = max_fp8_gain_pct(folder, item["input_tokens_approx"], item["concurrency"], skip_layers=skip)
        rows.append(
            RooflineRow(
                f"{item['model'].split('/')[-1]} c={item['concurrency']} ~{item['input_tokens_approx']:,} in",
                THROUGHPUT_GAIN,
                item["output_throughput_gain_pct"],
                gain,
                "output length not given; decode steps at the input length assumed",
                "largest decode-step gain from halved KV reads (bandwidth cancels)",
            )
        )
    return rows


@dataclass(frozen=True)
class SlopeRow:
    """One arm: its fitted slope (measured, with an interval) beside the roofline's."""

    arm: str
    kv_dtype: str
    slope_ms: float | None  # None: not measured (``not_measured`` says why)
    slope_ci: tuple[float, float] | None
    resolved: bool
    one_start: bool  # one server start only: the interval covers request-to-request noise, not start-to-start
    predicted_ms: float
    bandwidth_gb_s: float
    bandwidth_origin: str
    kv_longest_mib: float
    roofline_applies: bool
    no_claim: str  # why the roofline cannot describe the measured slope ("" when it can)
    not_measured: str = ""

    @property
    def ratio(self) -> float | None:
        """measured / predicted slope."""
        return None if self.slope_ms is None else self.slope_ms / self.predicted_ms

    @property
    def status(self) -> str:
        if self.slope_ms is None:
            return f"not measured on this machine: {self.not_measured}"
        text = "measured" if self.resolved else "not resolved: the slope's interval includes 0"
        if self.one_start:
            text += " (one server start only: the interval covers request-to-request noise, not start-to-start)"
        return text + (f"; no claim against the roofline: {self.no_claim}" if not self.roofline_applies else "")


CACHE_MARGIN = 4  # KV this many times the last-level cache: reads come mostly from memory


def roofline_applies(kv_bytes: float, cache_bytes: int | None, cache_origin: str, tokens: int) -> tuple[bool, str]:
    """Whether a DRAM-bandwidth roofline can describe KV reads of ``kv_bytes``, and why not."""
    if cache_bytes is None:
        return False, (
            f"the KV at {tokens:,} tokens is {kv_bytes / 2**20:.1f} MiB and the capture does not say how large "
            "the device's last-level cache is, so whether the reads came from memory is unknown"
        )
    if kv_bytes < CACHE_MARGIN * cache_bytes:
        return False, (
            f"the KV at {tokens:,} tokens is {kv_bytes / 2**20:.1f} MiB, not well beyond the "
            f"{cache_bytes / 2**20:.0f} MiB last-level cache ({cache_origin}): its reads need not come from memory"
        )
    return True, ""


@dataclass(frozen=True)
class DocsRow:
    """One context length of the vLLM documentation's table beside the roofline's one-user gain."""

    context: str  # the table's label
    tokens: int
    published_pct: float  # FP8 KV cache's output tok/s change, published
    roofline_pct: float
    users: int  # assumed (not published)
    origin: str

    @property
    def gap(self) -> float | None:
        """published / roofline, rounded to 2 decimals (None when the roofline predicts no gain)."""
        return round(self.published_pct / self.roofline_pct, 2) if self.roofline_pct > 0 else None


def docs_table_vs_roofline(path: str | Path, models_root: str | Path, users: int = 1) -> list[DocsRow]:
    """The vLLM documentation's L4 table (FP8 KV cache's throughput change per context length) beside
    the roofline's predicted speedup for the table's model at ``users`` (not published: assumed),
    both as "% more output tok/s" (a throughput gain is a TPOT speedup at equal concurrency)."""
    data = read_json(path)
    if data.get("source") != "published" or not data.get("rows"):
        raise StudyError(f"{path}: expected 'source': 'published' and 'rows'")
    folder = _folder(models_root, str(data["model"]))
    origin = f"published: vLLM docs (L4, {data['model']}); predicted: roofline from {folder}/config.json"
    rows = []
    for r in data["rows"]:
        tokens = int(r["context_tokens"])
        predicted = max_fp8_gain_pct(folder, tokens, users)
        rows.append(
            DocsRow(
                r.get("label", str(tokens)), tokens, float(r["fp8_throughput_change_pct"]), predicted, users, origin
            )
        )
    return rows
