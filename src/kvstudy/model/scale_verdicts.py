"""The records of a scale inspection (one KV scale tensor, one model folder's report, what a startup
log or run record says the engine did), its verdicts (what vLLM will do with the KV settings and
scales a folder has, and, given such a log, what the engine did: loaded, dropped or never had the
scales), and the scale-inspection notebook's tables and text built from the reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import is_finite_number, read_json
from kvstudy.outputs import generated_by_project
from kvstudy.vllm.command import version_release
from kvstudy.vllm.startup_log import StartupInfo, parse_startup_log


@dataclass
class ScaleTensor:
    """One KV scale tensor as stored (a deprecated ``kv_scale`` yields one record per kind)."""

    layer: int | None  # the first dotted number in the name (decoder layer), None if none
    kind: str  # "k" or "v" (query scales are kept apart, see ScaleReport.q_scales)
    name: str
    file: str  # the safetensors file it was read from, relative to the model folder
    dtype: str
    shape: list[int]
    values: list[float]
    style: str  # which of vLLM's naming conventions it follows


@dataclass
class ScaleReport:
    """Everything KV-related found in one model folder, with verdicts and input errors."""

    source: str  # what was asked for: a folder, a config.json or a cache id
    folder: str | None  # the resolved model folder, None if it could not be resolved
    kv_cache_dtype_in_config: str | None = None  # config.json's KV dtype, wherever it is declared
    kv_cache_dtype_field: str | None = None  # where: "kv_cache_dtype", "quantization_config.kv_cache_dtype", ...
    torch_dtype: str | None = None  # config.json torch_dtype (or dtype, transformers 5)
    quant_method: str | None = None  # quantization_config.quant_method
    kv_scheme: dict[str, Any] | None = None  # quantization_config.kv_cache_scheme as written
    kv_scheme_strategy: str | None = None  # its strategy: "tensor", "attn_head", ...
    kv_cache_quant_algo: str | None = None  # ModelOpt's, from hf_quant_config.json or quantization_config
    kv_cache_quant_algo_file: str | None = None  # which file declared it
    num_hidden_layers: int | None = None
    num_key_value_heads: int | None = None
    weights: str = "none"  # "safetensors", "bin-only" (not inspectable) or "none"
    files_read: list[str] = field(default_factory=list)
    scales: list[ScaleTensor] = field(default_factory=list)
    q_scales: list[ScaleTensor] = field(default_factory=list)
    bytes_read: int = 0
    config_read: bool = False
    verdicts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files_unread: list[str] = field(default_factory=list)  # inputs that could not be read (exit non-zero)
    checked_against: str | None = None  # the startup log or run record the verdicts used
    engine_outcome: str | None = None  # against that log: a key of OUTCOME_TEXT

    @property
    def has_scales(self) -> bool:
        return bool(self.scales)

    @property
    def readable(self) -> bool:
        """Whether anything at all could be read (config or a safetensors header)."""
        return self.config_read or bool(self.files_read)

    def scale_layers(self, kind: str) -> list[int]:
        return sorted({s.layer for s in self.scales if s.kind == kind and s.layer is not None})

    def span(self, kind: str | None = None) -> tuple[float, float] | None:
        """The smallest and largest finite scale value (of one kind), None when there is none."""
        finite = [v for s in self.scales if kind in (None, s.kind) for v in s.values if math.isfinite(v)]
        return (min(finite), max(finite)) if finite else None

    def per_head(self) -> bool:
        return any(len(s.values) > 1 for s in self.scales)

    def styles(self) -> str:
        return "; ".join(sorted({s.style for s in self.scales}))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for scale in data["scales"] + data["q_scales"]:
            scale["values"] = [_json_number(v) for v in scale["values"]]
        return data | {"has_scales": self.has_scales, "readable": self.readable}


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def declared_kv_dtype(report: ScaleReport) -> str | None:
    """The KV dtype the folder itself declares (kv_cache_dtype field, kv_cache_scheme or ModelOpt algo)."""
    if report.kv_cache_dtype_in_config is not None:
        return report.kv_cache_dtype_in_config
    if report.kv_scheme is not None:
        bits, kind = report.kv_scheme.get("num_bits"), report.kv_scheme.get("type")
        return "fp8" if (bits, kind) == (8, "float") else f"{kind}{bits}"
    if report.kv_cache_quant_algo is not None:
        return report.kv_cache_quant_algo.lower()
    return None


# quant_method values whose vLLM loader handles KV scales and warns when both end up 1.0.
WARNING_METHODS = {"fp8", "modelopt", "modelopt_fp4", "quark"}
# What a startup log or run record shows about the scales (ScaleReport.engine_outcome), and its verdict.
OUTCOME_TEXT = {
    "not-fp8": "the KV cache was stored as {dtype}, so KV scales were not used.",
    "unit-scales": "the scale-1.0 warning is expected: every KV scale in the checkpoint is 1.0.",
    "dropped": (
        "the checkpoint has KV scales but the log shows the 'scaling factor 1.0' warning: "
        "the loader dropped them and FP8 ran with scale 1.0 (as in vLLM issue 54623)."
    ),
    "consistent": (
        "FP8 KV cache and no scale-1.0 warning: consistent with the checkpoint's scales "
        "being loaded (the log alone cannot prove it)."
    ),
    "warning-expected": "the scale-1.0 warning matches the checkpoint, which has no KV scales.",
    "silent-unit-scale": (
        "FP8 KV cache, no scale-1.0 warning and no scales in the checkpoint: scale 1.0 was used silently."
    ),
    "unknown": "the log does not say which KV dtype was used; nothing to compare.",
    "too-early": (
        "the start failed before the weights were loaded (or while loading them), so the log "
        "cannot say whether scales loaded."
    ),
}


def kv_handling_method(report: ScaleReport) -> bool:
    return (report.quant_method or "").lower() in WARNING_METHODS


def _scale_summary(report: ScaleReport) -> str:
    span = report.span()
    values = f"values {span[0]:.4g} to {span[1]:.4g}" if span else "no finite values"
    total = f" of {report.num_hidden_layers}" if report.num_hidden_layers else ""
    return (
        f"KV scales present: k for {len(report.scale_layers('k'))}{total} layers, "
        f"v for {len(report.scale_layers('v'))}{total} layers, "
        f"{'per head' if report.per_head() else 'one per tensor'}, {values} ({report.styles()})."
    )


def _no_scale_verdict(report: ScaleReport) -> str:
    base = "No KV scale tensors in the checkpoint: with an FP8 KV cache vLLM uses scale 1.0 for k and v"
    method = report.quant_method
    if method is None:
        return base + (
            ", and prints no warning: a plain (unquantized) checkpoint never triggers the "
            "'Using KV cache scaling factor 1.0' warning, so a silent log does not mean scales loaded."
        )
    if kv_handling_method(report):
        return base + (
            f"; with quant_method '{method}' vLLM should print the 'Using KV cache scaling factor 1.0' warning."
        )
    return base + (
        f"; with quant_method '{method}' vLLM may print no warning (compressed-tensors "
        "stays silent when scales are missing)."
    )


def _forcing_verdicts(report: ScaleReport) -> list[str]:
    out = []
    if report.kv_scheme is not None:
        bits, kind = report.kv_scheme.get("num_bits"), report.kv_scheme.get("type")
        strategy = report.kv_scheme_strategy or "unset"
        out.append(
            f"config.json quantization_config.kv_cache_scheme ({kind} {bits}-bit, strategy {strategy}) "
            "declares an FP8 KV cache in the model folder: vLLM 0.20 stores KV in FP8 whatever "
            "--kv-cache-dtype says (an 'auto' vs 'fp8' A/B compares fp8 with fp8); 0.32 and 0.33 do so "
            "only when the flag is 'auto' (an explicit bfloat16 wins); 0.11 with 'auto' stays BF16."
        )
        if strategy not in ("tensor", "attn_head"):
            out.append(
                f"kv_cache_scheme strategy {strategy}: vLLM accepts only 'tensor' or 'attn_head' "
                "and refuses to load this checkpoint."
            )
        if strategy == "attn_head":
            out.append(
                "Per-head (attn_head) scales: vLLM keeps one scale per KV head for backends that take "
                "them; a backend that takes one scale per layer uses the largest head's scale."
            )
    if report.kv_cache_quant_algo is not None:
        sidecar = report.kv_cache_quant_algo_file != "config.json" and report.kv_scheme is None
        out.append(
            f"{report.kv_cache_quant_algo_file} declares kv_cache_quant_algo {report.kv_cache_quant_algo}: "
            f"from vLLM 0.14, --kv-cache-dtype auto resolves to it ({report.kv_cache_quant_algo.lower()}); "
            "0.11 with 'auto' stays BF16."
            + (
                " This is the config.json trap in its ModelOpt form: config.json itself declares no KV dtype, "
                "the hf_quant_config.json beside it does, so a study that reads only config.json would call "
                "this 'auto' cache 16-bit (kvstudy capacity counts 'auto' as FP8 here)."
                if sidecar
                else ""
            )
        )
    if report.kv_cache_dtype_in_config is not None:
        out.append(
            f"config.json sets {report.kv_cache_dtype_field} = {report.kv_cache_dtype_in_config}: a KV dtype "
            "declared in the model folder, not on the command line. vLLM 0.32.0's source does not read this "
            "field (other tools may); the startup log's KV dtype line says what the engine used."
        )
    return out


def _version_at_least(version: str | None, wanted: tuple[int, int]) -> bool:
    release = version_release(version)
    return release is None or release >= wanted  # unknown: assume recent


def effective_kv_dtype(report: ScaleReport, ev: StartupInfo) -> str | None:
    """The KV dtype the engine used: the logged one, or for the flag 'auto' the folder's declaration."""
    logged = ev.kv_cache_dtype
    if logged is None or logged.lower() != "auto":
        return logged
    if report.kv_scheme is not None and _version_at_least(ev.version, (0, 20)):
        return declared_kv_dtype(report)
    if report.kv_cache_quant_algo is not None and _version_at_least(ev.version, (0, 14)):
        return report.kv_cache_quant_algo.lower()
    return logged


def engine_outcome(report: ScaleReport, ev: StartupInfo) -> str:
    """A key of OUTCOME_TEXT: what the log says happened to this checkpoint's scales."""
    fp8 = (effective_kv_dtype(report, ev) or "").lower().startswith("fp8")
    if not ev.kv_scale_warning and not _past_weights(ev):
        return "too-early"
    if ev.kv_cache_dtype is not None and not fp8 and not ev.kv_scale_warning:
        return "not-fp8"
    if report.has_scales and ev.kv_scale_warning:
        return "unit-scales" if all(v == 1.0 for s in report.scales for v in s.values) else "dropped"
    if report.has_scales:
        return "consistent" if fp8 else "unknown"
    if ev.kv_scale_warning:
        return "warning-expected"
    return "silent-unit-scale" if fp8 else "unknown"


def _evidence_verdict(report: ScaleReport, ev: StartupInfo) -> str:
    outcome = report.engine_outcome = engine_outcome(report, ev)
    text = OUTCOME_TEXT[outcome].format(dtype=ev.kv_cache_dtype)
    effective = effective_kv_dtype(report, ev)
    if (ev.kv_cache_dtype or "").lower() == "auto" and effective != ev.kv_cache_dtype:
        text += (
            f" The flag was 'auto': the folder's declaration made the KV cache {effective}, "
            "although the log never names that dtype."
        )
    cause = f": {ev.failure_cause.rstrip('.')}" if ev.failure_cause else ""
    if ev.failed and outcome != "too-early":
        text += f" (The start failed afterwards, once the weights and scales were loaded{cause}.)"
    elif ev.failed:
        text += f" (Cause{cause or ': not named in the log'}.)"
    return f"{report.checked_against}" + (f" (vLLM {ev.version})" if ev.version else "") + f": {text}"


def verdicts(report: ScaleReport, evidence: StartupInfo | None) -> list[str]:
    out: list[str] = []
    if report.weights == "bin-only":
        out.append("Weights are only in pickle (.bin) files: KV scales cannot be inspected safely.")
    elif report.weights == "none":
        out.append("No weight files in the folder: whether KV scales exist cannot be checked here.")
    elif report.has_scales:
        out.append(_scale_summary(report))
        if report.num_hidden_layers:
            missing = sorted(set(range(report.num_hidden_layers)) - set(report.scale_layers("k")))
            if missing and len(missing) < report.num_hidden_layers:
                out.append(f"Layers without a k scale (they run with 1.0): {missing[:16]}.")
    elif report.files_read:
        out.append(_no_scale_verdict(report))
    out += _forcing_verdicts(report)
    if evidence is not None:
        out.append(_evidence_verdict(report, evidence))
    return out


def read_evidence(path: str | Path) -> StartupInfo:
    """What the engine did about the KV cache: a startup log (text, parsed by kvstudy.vllm.startup_log), or the
    fields the verdicts read from a resolved-run record or a parsed log (JSON)."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: no such startup log or run record")
    if path.suffix != ".json":
        return parse_startup_log(path)
    data = read_json(path)
    fields = data.get("resolved", data) if isinstance(data, dict) else None
    if not isinstance(fields, dict) or not isinstance(fields.get("kv_scale_warning"), bool):
        raise StudyError(
            f"{path}: expected a JSON object (a resolved-run record or a parsed startup log) "
            "with a boolean 'kv_scale_warning'"
        )
    text = lambda key: None if fields.get(key) is None else str(fields[key])  # noqa: E731
    number = lambda key: fields[key] if is_finite_number(fields.get(key)) else None  # noqa: E731
    return StartupInfo(
        kv_cache_dtype=text("kv_cache_dtype"),
        version=text("version"),
        failure_cause=text("failure_cause"),
        kv_scale_warning=fields["kv_scale_warning"],
        failed=fields.get("failed") is True,
        ready=fields.get("ready") is True,
        pool_tokens=number("pool_tokens"),
        model_load_gib=number("model_load_gib"),
    )


def _past_weights(ev: StartupInfo) -> bool:
    """Whether the start got past weight loading (where vLLM prints the scale-1.0 warning): it did not fail,
    or it sized a pool, or got ready."""
    return not ev.failed or ev.ready or ev.pool_tokens is not None or ev.model_load_gib is not None


def _span(report: ScaleReport, kind: str) -> str | None:
    span = report.span(kind)
    return None if span is None else f"{span[0]:.4g}" + (f" to {span[1]:.4g}" if span[0] != span[1] else "")


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
