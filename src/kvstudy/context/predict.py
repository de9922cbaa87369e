"""The roofline's predictions set beside the published figures (seed 003) and beside a live fit.

Each row says where each value comes from: "published (seed 003)", "predicted (roofline)",
"derived" (arithmetic on published figures), "measured" (a live capture). The roofline reads KV
bytes only, with no fixed per-step FP8 cost, so it predicts a slope ratio of exactly 0.5 for any
layer whose KV is stored in FP8 and a break-even length of 0 (FP8 never slower); what the published
figures show beyond that (a ratio above 0.5, a break-even of thousands of tokens) is the cost the
roofline leaves out, and the tables state that gap as a figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.context.published import derive_all, load_published, slope_figures
from kvstudy.errors import StudyError
from kvstudy.formats import per_token_interval, significant
from kvstudy.gpu_catalog import find_gpu
from kvstudy.io import read_json
from kvstudy.model.capacity import kv_footprint
from kvstudy.model.layout import ModelLayout, load_layout
from kvstudy.model.roofline import max_fp8_gain_pct, predicted_slope_ms_per_token

PUBLISHED = "published (seed 003)"
PREDICTED = "predicted (roofline)"
DERIVED = "derived from published figures"
MEASURED = "measured (live capture)"


@dataclass(frozen=True)
class Setting:
    """Where the roofline evaluates a published figure: a model folder, a GPU, and what is assumed."""

    model_dir: str
    gpu: str | None
    assumed: str  # what the text does not give and the prediction had to assume


def _model_dir(models_root: Path, hub_id: str) -> str:
    folder = models_root / hub_id.split("/")[-1]
    if not (folder / "config.json").is_file():
        raise StudyError(f"{folder}/config.json: not found (the roofline needs the config of {hub_id})")
    return str(folder)


def _settings(models_root: Path, model: str, gpu: str | None, assumed_gpu: str) -> Setting:
    if gpu:
        return Setting(_model_dir(models_root, model), gpu, "")
    return Setting(_model_dir(models_root, model), assumed_gpu, f"GPU not given by the text; {assumed_gpu} assumed")


def _gpu_name(gpu: str) -> str:
    return {"H100": "H100-SXM"}.get(gpu, gpu)


def published_vs_roofline(
    models_root: str | Path,
    bandwidth_factor: float = 1.0,
    assumed_gpu: str = "H100-SXM",
    path: str | Path | None = None,
) -> Any:
    """One row per published context-scaling figure: the value as printed, the roofline's, and the gap.

    ``bandwidth_factor`` 1.0 (peak) by default: the roofline's default 0.9 was itself read off the
    H100 slope, so using it here would predict that slope from itself.
    """
    import pandas as pd

    root = Path(models_root)
    rows: list[dict[str, Any]] = []
    for fig, der in zip(slope_figures(path), derive_all(path)):
        where = _settings(root, fig.model, fig.gpu and _gpu_name(fig.gpu), assumed_gpu)
        skip = "sliding_window" if "skip-layers sliding_window" in fig.candidate else None
        bw = find_gpu(where.gpu or assumed_gpu).bandwidth_gb_s
        pb = predicted_slope_ms_per_token(where.model_dir, "bfloat16", bw, bandwidth_factor)
        pc = predicted_slope_ms_per_token(where.model_dir, "fp8", bw, bandwidth_factor, skip_layers=skip)
        note = where.assumed
        if fig.slope_baseline_ms_per_token is not None:
            rows.append(
                _row(
                    fig.id,
                    "BF16 ITL slope (ms/token)",
                    fig.slope_baseline_ms_per_token,
                    pb,
                    note,
                    f"at {where.gpu} peak x {bandwidth_factor:g}",
                )
            )
            rows.append(
                _row(
                    fig.id,
                    "FP8 ITL slope (ms/token)",
                    fig.slope_candidate_ms_per_token,
                    pc,
                    note,
                    f"at {where.gpu} peak x {bandwidth_factor:g}",
                )
            )
        rows.append(
            _row(
                fig.id,
                "slope ratio FP8/BF16",
                der.slope_ratio,
                pc / pb,
                note,
                "KV bytes per token halved" + (" in full-attention layers" if skip else ""),
                published_origin=PUBLISHED if der.ratio_source == "printed ratio" else f"{DERIVED} (absolute slopes)",
            )
        )
        if fig.break_even_tokens is not None:
            rows.append(
                _row(
                    fig.id,
                    "break-even context (tokens)",
                    float(fig.break_even_tokens),
                    0.0,
                    note,
                    "no fixed FP8 cost in the roofline: FP8 is never slower",
                )
            )
        if der.fixed_cost_ms is not None:
            rows.append(
                _row(
                    fig.id,
                    "implied fixed FP8 cost per step (ms)",
                    der.fixed_cost_ms,
                    0.0,
                    note,
                    "slope difference x break-even length",
                    published_origin=DERIVED,
                )
            )
        elif der.fixed_cost_bf16_slope_tokens is not None:
            rows.append(
                _row(
                    fig.id,
                    "implied fixed FP8 cost (tokens of BF16 slope)",
                    der.fixed_cost_bf16_slope_tokens,
                    0.0,
                    note,
                    "(1 - ratio) x break-even length",
                    published_origin=DERIVED,
                )
            )
    data = load_published(path)
    for item in data["throughput_under_load"]:
        skip = "sliding_window" if "sliding_window" in item["candidate"] else None
        where = _settings(root, item["model"], None, assumed_gpu)
        gain = max_fp8_gain_pct(where.model_dir, item["input_tokens_approx"], item["concurrency"], skip_layers=skip)
        rows.append(
            _row(
                f"{item['model'].split('/')[-1]} c={item['concurrency']} ~{item['input_tokens_approx']:,} in",
                "output throughput gain (%)",
                item["output_throughput_gain_pct"],
                gain,
                "output length not given; decode steps at the input length assumed",
                "largest decode-step gain from halved KV reads (bandwidth cancels)",
            )
        )
    return pd.DataFrame(rows)


def _row(
    figure: str,
    quantity: str,
    published: float | None,
    predicted: float,
    assumed: str,
    basis: str,
    published_origin: str = PUBLISHED,
) -> dict[str, Any]:
    gap = published / predicted if published is not None and predicted else None
    return {
        "figure": figure,
        "quantity": quantity,
        "published": published,
        "published origin": published_origin,
        "roofline": predicted,
        "roofline basis": basis,
        "published / roofline": gap,
        "assumed": assumed,
    }


def measured_vs_predicted(
    fits: dict[str, Any],
    arms: dict[str, str],
    model: str,
    bandwidth_gb_s: float,
    bandwidth_origin: str,
    not_measured: dict[str, str] | None = None,
    skip_layers: dict[str, str | None] | None = None,
    longest: int | None = None,
    cache_bytes: int | None = None,
    cache_origin: str = "",
) -> Any:
    """Per arm: the fitted slope with its interval (measured) beside the roofline's from ``bandwidth_gb_s``.

    ``arms`` maps arm name -> KV dtype; ``fits`` arm -> LineFit (kvstudy.context.fit); an arm without a
    fit says why (``not_measured``). The bandwidth factor is 1: a measured bandwidth is already achievable.

    A memory-bandwidth roofline describes KV reads only when they come from memory: where the arm's KV
    at the ``longest`` length is not well beyond the device's last-level cache (``cache_bytes``, at
    least :data:`CACHE_MARGIN` times it) the comparison is marked as not applicable and makes no claim;
    where the cache size is unknown, the comparison says so.
    """
    import pandas as pd

    layout = load_layout(model)  # read once: every arm's prediction and KV size come from it
    rows = []
    for arm, dtype in arms.items():
        pred = predicted_slope_ms_per_token(
            layout, dtype, bandwidth_gb_s, 1.0, skip_layers=(skip_layers or {}).get(arm)
        )
        kv_longest = kv_bytes_at(layout, dtype, longest, (skip_layers or {}).get(arm)) if longest else None
        applies, why_not = roofline_applies(kv_longest, cache_bytes, cache_origin, longest)
        fit = fits.get(arm)
        if fit is None:
            why = (not_measured or {}).get(arm, "no measurable cells")
            rows.append(
                {
                    "arm": arm,
                    "kv dtype": dtype,
                    "measured slope (ms/token)": None,
                    "95 % interval": "",
                    "resolved": False,
                    "predicted slope (ms/token)": pred,
                    f"bandwidth ({bandwidth_origin})": bandwidth_gb_s,
                    "measured / predicted": None,
                    "measured / predicted, 95 %": "",
                    "KV at the longest length (MiB)": None if kv_longest is None else kv_longest / 2**20,
                    "roofline applies": applies,
                    "status": f"not measured on this machine: {why}",
                }
            )
            continue
        lo, hi = fit.slope_ci
        rows.append(
            {
                "arm": arm,
                "kv dtype": dtype,
                "measured slope (ms/token)": fit.slope_ms_per_token,
                "95 % interval": per_token_interval(lo, hi),
                "resolved": fit.resolved,
                "predicted slope (ms/token)": pred,
                f"bandwidth ({bandwidth_origin})": bandwidth_gb_s,
                "measured / predicted": fit.slope_ms_per_token / pred,
                "measured / predicted, 95 %": f"{significant(lo / pred, 2)} .. {significant(hi / pred, 2)}",
                "KV at the longest length (MiB)": None if kv_longest is None else kv_longest / 2**20,
                "roofline applies": applies,
                "status": _status(fit) + ("" if applies else f"; no claim against the roofline: {why_not}"),
            }
        )
    return pd.DataFrame(rows)


CACHE_MARGIN = 4  # KV this many times the last-level cache: reads come mostly from memory


def kv_bytes_at(model: str | ModelLayout, dtype: str, tokens: int, skip_layers: str | None = None) -> float:
    """Bytes of KV one request of ``tokens`` tokens holds (the growing layers; windows capped)."""
    return float(kv_footprint(load_layout(model), dtype, tokens, skip_layers).bytes_per_request)


def roofline_applies(
    kv_bytes: float | None, cache_bytes: int | None, cache_origin: str, tokens: int | None
) -> tuple[bool, str]:
    """Whether a DRAM-bandwidth roofline can describe KV reads of ``kv_bytes``, and why not."""
    if kv_bytes is None:
        return False, "the longest length is not known"
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


def _status(fit: Any) -> str:
    """ "measured" or "not resolved", and a warning when one server start is all the interval covers."""
    text = "measured" if fit.resolved else "not resolved: the slope's interval includes 0"
    if fit.runs < 2:
        text += " (one server start only: the interval covers request-to-request noise, not start-to-start)"
    return text


def docs_table_vs_roofline(path: str | Path, models_root: str | Path, users: int = 1) -> Any:
    """The vLLM documentation's L4 table (FP8 KV cache's throughput change per context length) beside
    the roofline's predicted speedup for the table's model at ``users`` (not published: assumed),
    both as "% more output tok/s" (a throughput gain is a TPOT speedup at equal concurrency)."""
    import pandas as pd

    data = read_json(path)
    if data.get("source") != "published" or not data.get("rows"):
        raise StudyError(f"{path}: expected 'source': 'published' and 'rows'")
    folder = _model_dir(Path(models_root), str(data["model"]))
    rows = []
    for r in data["rows"]:
        tokens = int(r["context_tokens"])
        predicted = max_fp8_gain_pct(folder, tokens, users)
        published = float(r["fp8_throughput_change_pct"])
        rows.append(
            {
                "context": r.get("label", str(tokens)),
                "tokens": tokens,
                "FP8 tok/s change (%), published": published,
                f"roofline gain (%), {users} user(s) assumed": round(predicted, 2),
                "published / roofline": round(published / predicted, 2) if predicted > 0 else None,
                "origin": f"published: vLLM docs (L4, {data['model']}); predicted: roofline from {folder}/config.json",
            }
        )
    return pd.DataFrame(rows)
