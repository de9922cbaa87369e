"""Tables and text for the scale-inspection notebook, built from scale reports."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.model.scale_verdicts import ScaleReport, declared_kv_dtype, kv_handling_method
from kvstudy.outputs import generated_by_project


def _span(report: ScaleReport, kind: str) -> str | None:
    span = report.span(kind)
    if span is None:
        return None
    low, high = span
    return f"{low:.4g}" if low == high else f"{low:.4g} to {high:.4g}"


def findings_table(reports: Sequence[ScaleReport]) -> Any:
    """One row per report: what the folder declares, which scales it holds, what went wrong."""
    import pandas as pd

    rows = [
        {
            "model": r.source,
            "weights": r.weights,
            "quant method": r.quant_method,
            "declares KV": declared_kv_dtype(r),
            "scheme strategy": r.kv_scheme_strategy,
            "layers with k / v scales": f"{len(r.scale_layers('k'))} / {len(r.scale_layers('v'))}"
            + (f" of {r.num_hidden_layers}" if r.num_hidden_layers else ""),
            "naming": r.styles() or None,
            "per head": r.per_head() if r.scales else None,
            "k scales": _span(r, "k"),
            "v scales": _span(r, "v"),
            "log check": r.engine_outcome,
            "bytes read": r.bytes_read,
            "errors": len(r.errors),
        }
        for r in reports
    ]
    return pd.DataFrame(rows).astype(object).fillna("–")


def scale_values_frame(reports: Sequence[ScaleReport]) -> Any:
    """Long table of every stored scale value: model, layer, kind, head, value."""
    import pandas as pd

    rows = [
        {"model": r.source, "layer": s.layer, "kind": s.kind, "head": head, "value": value, "name": s.name}
        for r in reports
        for s in r.scales
        for head, value in enumerate(s.values)
    ]
    return pd.DataFrame(rows, columns=["model", "layer", "kind", "head", "value", "name"])


def verdicts_markdown(reports: Sequence[ScaleReport]) -> str:
    parts = ([f"**{r.source}**"] + [f"- {v}" for v in r.verdicts or ["(nothing could be read)"]] for r in reports)
    return "\n\n".join("\n".join(lines) for lines in parts)


def pool_comparisons(dump: Any) -> list[str]:
    """For folders logged under several KV flags: the pool each flag got (same KV memory assumed)."""
    if dump is None or len(dump) == 0 or "log_pool_tokens" not in dump:
        return []
    lines = []
    for config, rows in dump.dropna(subset=["log_pool_tokens"]).groupby("config", sort=True):
        if rows["log_kv_dtype"].nunique() < 2:
            continue
        parts = [f"{int(r.log_pool_tokens):,} tokens with {r.log_kv_dtype}" for r in rows.itertuples()]
        ratio = rows["log_pool_tokens"].max() / rows["log_pool_tokens"].min()
        lines.append(f"{Path(config).parent.name}: {' vs '.join(parts)} (ratio {ratio:.2f})")
    return lines


def summarize(reports: Sequence[ScaleReport], dump: Any = None) -> dict[str, Any]:
    """Counts behind the notebook's conclusion, a paragraph and a one-line finding."""
    readable = [r for r in reports if r.readable and r.weights == "safetensors"]
    dumped = dump is not None and len(dump) > 0
    counts = {
        "models": len(reports),
        # folders this project generated (test checkpoints, tiny models), not published checkpoints
        "generated": sum(r.folder is not None and generated_by_project(r.folder) for r in reports),
        "inspected": len(readable),
        "with_scales": sum(r.has_scales for r in readable),
        "declare_kv": sum(declared_kv_dtype(r) is not None for r in reports),
        "silent_unit_scale": sum(not r.has_scales and not kv_handling_method(r) for r in readable),
        "with_errors": sum(bool(r.errors) for r in reports),
        "checked": sum(r.engine_outcome is not None for r in reports),
        "dropped": sum(r.engine_outcome == "dropped" for r in reports),
        "disagree": int((dump["agree"] == False).sum()) if dumped else 0,  # noqa: E712
        "dump_compared": int(dump["agree"].notna().sum()) if dumped else 0,
    }
    pool_lines = pool_comparisons(dump)
    counts["pool_comparisons"] = len(pool_lines)
    c = counts
    text = (
        f"Of {c['models']} model folders, {c['inspected']} had safetensors weights to inspect and "
        f"{c['with_scales']} of those carry KV scale tensors. Folders that declare a KV dtype themselves: "
        f"{c['declare_kv']}. Folders with no scales and no KV-handling quantization method, which run "
        f"`--kv-cache-dtype fp8` with scale 1.0 and no warning: {c['silent_unit_scale']}. "
        f"Folders with problems in their files: {c['with_errors']}. "
    )
    if c["checked"]:
        text += (
            f"Against {c['checked']} startup logs, {c['dropped']} show scales that the checkpoint has "
            "but the loader dropped. "
        )
    if c["dump_compared"]:
        text += (
            f"In the settings dump, {c['disagree']} of {c['dump_compared']} logs used a KV dtype other than "
            "the one the folder declares."
        )
    if pool_lines:
        text += " Logged pools of the same folder under different flags: " + "; ".join(pool_lines) + "."
    finding = (
        f"{c['with_scales']} of {c['inspected']} inspected checkpoints carry KV scales, "
        f"{c['declare_kv']} of {c['models']} folders declare their own KV dtype, and "
        f"{c['silent_unit_scale']} would run FP8 at scale 1.0 with no warning"
    )
    if c["generated"]:
        finding += (
            f" ({'all' if c['generated'] == c['models'] else c['generated']} of the {c['models']} folders are test "
            "checkpoints this project generated, not published models)"
        )
    if c["checked"]:
        finding += f"; {c['dropped']} of {c['checked']} logs show dropped scales"
    if c["dump_compared"]:
        finding += f"; {c['disagree']} of {c['dump_compared']} logs disagree with the folder's KV dtype"
    return {"counts": counts, "text": text, "finding": finding + "."}
