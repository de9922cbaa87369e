"""The calculator: a model on a GPU (from the catalog or given figures), with tensor
parallelism, and what it holds: KV pool per GPU, users per context length, GPUs x TP tables.

Every figure keeps a label saying where it came from: "from the GPU catalog (NAME)", "given",
"vLLM 0.32 default" (``kvstudy.vllm.facts``), or the weights' own source (checkpoint or estimate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import find_gpu
from kvstudy.io import is_finite_number
from kvstudy.model.capacity import GIB, check_context, check_number, kv_footprint
from kvstudy.model.layout import FULL, MLA, SLIDING, ModelLayout
from kvstudy.model.oracle import resolve_layout
from kvstudy.model.weights import WeightsUnknown, weights_size
from kvstudy.redact import write_csv
from kvstudy.vllm.facts import DEFAULT_GPU_MEMORY_UTILIZATION, KV_AUTO_FROM_CHECKPOINT_SOURCE, KV_POOL_OVERHEAD

# Why a pool from GPU memory and weights alone comes out above the engine's: issue 20 compared such
# predictions with the pools 24 public vLLM startup logs report (5-20 % above them).
GPU_ONLY_OVERHEAD_NOTE = (
    f"not counted: {KV_POOL_OVERHEAD}; this pool subtracts only the weights, so it is above the engine's "
    "(5-20 % above the pools of 24 public vLLM logs, issue 20); `kvstudy startup-log LOG --model M` reads "
    "the real figures from a server's log"
)


@dataclass(frozen=True)
class GpuMemory:
    """The memory one GPU offers vLLM, with the source of each figure."""

    gpu_name: str | None
    memory_gib: float
    memory_source: str
    utilization: float
    utilization_source: str


@dataclass(frozen=True)
class GroupPool:
    """The KV pool of each GPU in a tensor-parallel group, or why there is none."""

    weights_bytes_per_gpu: int
    requested_bytes: int  # GPU memory x utilization
    overhead_bytes: int  # activations, non-torch memory, CUDA graphs (an assumption)
    kv_pool_bytes: int  # what is left for the KV cache (0 if nothing)
    message: str  # why the weights do not fit; "" when they do

    @property
    def fits(self) -> bool:
        return self.kv_pool_bytes > 0


def resolve_gpu_memory(
    gpu: str | None = None, gpu_memory_gib: float | None = None, gpu_memory_utilization: float | None = None
) -> GpuMemory:
    """GPU memory from the catalog (``gpu``) unless given; utilization given or vLLM's default."""
    spec = find_gpu(gpu) if gpu is not None else None
    if gpu_memory_gib is not None:
        memory, source = float(gpu_memory_gib), "given"
    elif spec is None:
        raise StudyError(
            "gpu memory: give a GPU name from the catalog (--gpu, parameter gpu) "
            "or its memory in GiB (--gpu-memory-gib, parameter gpu_memory_gib)"
        )
    elif spec.cuda_total_bytes is not None:  # what vLLM multiplies by the utilization
        memory = spec.cuda_total_bytes / GIB
        source = (
            f"from the GPU catalog ({spec.name}, CUDA's total {spec.cuda_total_bytes:,} B, which vLLM "
            f"multiplies by the utilization; the driver shows {spec.memory_mib_driver:,} MiB)"
        )
    else:
        memory = spec.memory_gib
        source = (
            f"from the GPU catalog ({spec.name}, {spec.memory_mib_driver:,} MiB as the driver reports it; "
            "CUDA's total, which vLLM uses, is not in the catalog and can be a little lower)"
        )
    if gpu_memory_utilization is None:
        utilization = (DEFAULT_GPU_MEMORY_UTILIZATION, "vLLM 0.32 default (vllm/config/cache.py)")
    else:
        utilization = (float(gpu_memory_utilization), "given")
    return GpuMemory(spec.name if spec else None, memory, source, *utilization)


def group_pool(
    memory: GpuMemory, weights_bytes: int, overhead_gib: float = 0.0, tensor_parallel_size: int = 1
) -> GroupPool:
    """Each GPU's KV pool: its memory x utilization - its share of the weights - overhead (an assumption).

    The weights are split evenly over the group (an approximation: vLLM replicates norms and, when
    tp > kv heads, the K/V projections). A model that does not fit gets ``fits=False`` and a message.
    """
    check_number(memory.memory_gib, "gpu_memory_gib")
    check_number(memory.utilization, "gpu_memory_utilization", 1)
    if not is_finite_number(overhead_gib) or overhead_gib < 0:
        raise StudyError(f"overhead_gib {overhead_gib!r}: expected a number of GiB >= 0")
    per_gpu = -(-int(weights_bytes) // tensor_parallel_size)
    requested = int(int(memory.memory_gib * GIB) * memory.utilization)
    overhead = int(overhead_gib * GIB)
    pool = max(requested - per_gpu - overhead, 0)
    where = "per GPU " if tensor_parallel_size > 1 else ""
    less = f" less {overhead_gib:.2f} GiB overhead" if overhead_gib else ""
    message = (
        f"the weights {where}({per_gpu / GIB:.2f} GiB) exceed the memory vLLM may use ({requested / GIB:.2f} GiB"
        f"{less}): use a larger GPU, more GPUs (tensor parallelism), or a smaller checkpoint"
    )
    return GroupPool(per_gpu, requested, overhead, pool, "" if pool else message)


def users_at(
    layout: ModelLayout,
    kv_dtype: str,
    pool_bytes_per_gpu: int,
    context_len: int,
    tensor_parallel_size: int = 1,
    skip_layers: str | None = None,
) -> int:
    """Whole requests of ``context_len`` tokens the group holds at once (each GPU holds its share of every one).

    A hybrid model's state counts twice: vLLM 0.32's default mamba cache mode ('align', with prefix
    caching on) reserves two state blocks per request (``allocator.mamba_cache_mode_for``)."""
    fp = kv_footprint(layout, kv_dtype, context_len, skip_layers, tensor_parallel_size)
    per_request = fp.bytes_per_request_per_gpu + fp.state_bytes_per_request_per_gpu
    if fp.bytes_per_request_per_gpu <= 0:
        return 0
    return int(pool_bytes_per_gpu // per_request)


def users_vs_context(
    layout: ModelLayout,
    kv_dtypes: list[str],
    pool_bytes_per_gpu: int,
    contexts: list[int],
    tensor_parallel_size: int = 1,
    skip_layers: str | None = None,
) -> Any:
    """Users that fit per context length (rows) and KV dtype (columns), a DataFrame."""
    import pandas as pd

    users = {
        d: [users_at(layout, d, pool_bytes_per_gpu, n, tensor_parallel_size, skip_layers) for n in contexts]
        for d in kv_dtypes
    }
    return pd.DataFrame(users, index=pd.Index(contexts, name="context length (tokens)"))


def gpu_tp_table(
    layout: ModelLayout,
    kv_dtypes: list[str],
    gpus: list[str],
    tensor_parallel_sizes: list[int],
    context_len: int,
    weights_bytes: int,
    gpu_memory_utilization: float | None = None,
    overhead_gib: float = 0.0,
) -> Any:
    """One row per GPU and TP size: weights and KV pool per GPU, users at ``context_len`` per KV dtype."""
    import pandas as pd

    rows = []
    for name in gpus:
        memory = resolve_gpu_memory(name, None, gpu_memory_utilization)
        for tp in [t for t in tensor_parallel_sizes if t not in dict(layout.tp_refused)]:  # vLLM accepts them
            plan = group_pool(memory, weights_bytes, overhead_gib, tp)
            users = {f"users {d}": users_at(layout, d, plan.kv_pool_bytes, context_len, tp) for d in kv_dtypes}
            rows.append(
                {
                    "GPU": memory.gpu_name,
                    "TP": tp,
                    "weights per GPU (GiB)": plan.weights_bytes_per_gpu / GIB,
                    "KV pool per GPU (GiB)": plan.kv_pool_bytes / GIB,
                    **users,
                }
            )
    return pd.DataFrame(rows).set_index(["GPU", "TP"])


def plan_summary(
    path: str,
    *,
    assume: str | None = None,
    tensor_parallel_size: int = 1,
    kv_dtype: list[str] | None = None,
    max_model_len: int | None = None,
    skip_layers: str | None = None,
    weights_gib: float | None = None,
    gpu: str | None = None,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float | None = None,
    allow_long_context: bool = False,
) -> dict[str, Any]:
    """The ``capacity`` command's object (its options, by name): the model's layer kinds and, per KV dtype,
    the footprint figures; when a GPU is named, the pool and the users it holds."""
    tp = tensor_parallel_size
    layout = resolve_layout(path, assume, tuple(sorted({1, 2, 4, 8, tp})))
    check_plan(layout, tp, max_model_len, allow_long_context)
    # default: the model's 16-bit dtype, fp8 and nvfp4 (MLA: its own fp8/nvfp4 formats); first 'auto' when
    # the checkpoint makes it store something other than the model dtype
    quantized = ["fp8_ds_mla", "nvfp4_ds_mla"] if layout.count(MLA) else ["nvfp4"]
    dtypes = kv_dtype or ["auto"] * bool(layout.kv_scheme_dtype) + [layout.model_dtype, "fp8", *quantized]
    footprints = {d: kv_footprint(layout, d, max_model_len, skip_layers, tp) for d in dtypes}
    notes = list(layout.notes)
    if layout.kv_scheme_dtype:  # why 'auto' stores what it does
        notes.append(
            f"--kv-cache-dtype auto stores {layout.kv_scheme_dtype} here, not {layout.model_dtype}: the checkpoint "
            f"chooses it ({layout.kv_scheme_source}; {KV_AUTO_FROM_CHECKPOINT_SOURCE})"
        )
    weights_bytes: int | None
    try:
        size = weights_size(path, layout, None if weights_gib is None else weights_gib * GIB)
        weights_bytes, weights_source = size.bytes, size.source
    except WeightsUnknown as exc:  # the KV figures stand without the weights
        weights_bytes, weights_source = None, f"unknown: {exc}"
    first = footprints[dtypes[0]]
    summary: dict[str, Any] = {
        "model": layout.name,
        "config": layout.config_path,
        "model_type": layout.model_type,
        "architecture": layout.architecture,
        "model_dtype": layout.model_dtype,
        "layer_kinds": layout.layer_kinds,
        "sliding_windows": list(layout.sliding_windows),
        "attention_chunk_sizes": list(layout.chunk_sizes),
        "warnings": list(layout.warnings),
        "notes": notes,
        "auto_kv_dtype": {"stores": layout.kv_scheme_dtype or layout.model_dtype, "chosen_by": layout.kv_scheme_source},
        "skip_layers": skip_layers,
        "tensor_parallel_size": tp,
        "context_len": first.context_len,
        "cap_tokens": first.cap_tokens,
        "source": layout.source,
        "tensor_parallel_refused": {str(t): why for t, why in layout.tp_refused},
        "weights_bytes": weights_bytes,
        "weights_source": weights_source,
        "dtypes": {
            d: asdict(fp)
            | {"kib_per_token": fp.kib_per_token, "tokens_per_gib": fp.tokens_per_gib if fp.bytes_per_token else None}
            for d, fp in footprints.items()
        },
    }
    if (gpu is None and gpu_memory_gib is None) or weights_bytes is None:
        return summary
    memory = resolve_gpu_memory(gpu, gpu_memory_gib, gpu_memory_utilization)
    plan = group_pool(memory, weights_bytes, 0.0, tp)
    summary["gpu"] = asdict(memory) | asdict(plan) | {"fits": plan.fits, "overhead": GPU_ONLY_OVERHEAD_NOTE}
    for dtype, row in summary["dtypes"].items():
        row["users"] = users_at(layout, dtype, plan.kv_pool_bytes, first.context_len, tp)
    return summary


def check_plan(
    layout: ModelLayout, tensor_parallel_size: int, context_len: int | None, allow_long: bool = False
) -> None:
    """Refuse a plan vLLM would refuse: a TP size it rejects, a context past the config's limit (unless asked)."""
    refused = dict(layout.tp_refused).get(tensor_parallel_size)
    if refused:
        raise StudyError(f"--tensor-parallel-size {tensor_parallel_size}: {refused}")
    if context_len is not None:
        check_context(layout, context_len, allow_long)


def pool_sections_skipped(model_name: str, weights_problem: str | None, kv_memory_gib: float | None) -> str | None:
    """Why a report skips its pool and users sections (one sentence), or None when it can count them.

    Without the weights a pool from GPU memory would be too large by their whole size, so it is not
    counted; a KV memory given as such (``kv_memory_gib``) needs no weights. Pass ``kv_memory_gib=None``
    for what always needs them (the GPUs x TP table, a held pool's implied overhead)."""
    if weights_problem is None or kv_memory_gib is not None:
        return None
    return (
        f"Skipped: the weights of {model_name} are unknown ({weights_problem}), and a pool from GPU memory "
        "without them would be too large by their whole size; pass `weights_gib` (their memory in GiB) "
        "or `kv_memory_gib` (the KV memory itself) to count it."
    )


def _format(summary: dict[str, Any]) -> str:
    kinds = ", ".join(f"{n} {k}" for k, n in summary["layer_kinds"].items())
    tp = summary["tensor_parallel_size"]
    lines = [
        f"{summary['model']} ({summary['model_type']}, {kinds}); request of {summary['context_len']:,} tokens"
        + (f"; TP {tp}" if tp > 1 else "")
        + (f"; skip layers {summary['skip_layers']}" if summary["skip_layers"] else "")
        + f"; KV figures from {summary['source']}"
    ]
    lines += [f"WARNING: {w}" for w in summary["warnings"]] + [f"note: {n}" for n in summary["notes"]]
    if summary["weights_bytes"] is None:
        lines.append(
            f"weights {summary['weights_source']} (no GPU pool or users without them; --weights-gib gives them)"
        )
    else:
        lines.append(f"weights {summary['weights_bytes'] / GIB:,.2f} GiB ({summary['weights_source']})")
    if summary["tensor_parallel_refused"]:
        lines.append("TP sizes vLLM refuses: " + "; ".join(summary["tensor_parallel_refused"].values()))
    gpu = summary.get("gpu")
    if gpu:
        lines.append(
            f"GPU {gpu['gpu_name'] or ''} {gpu['memory_gib']:.2f} GiB ({gpu['memory_source']}) x utilization "
            f"{gpu['utilization']} ({gpu['utilization_source']}): KV pool per GPU "
            f"{gpu['kv_pool_bytes'] / GIB:,.2f} GiB" + (f"; {gpu['message']}" if gpu["message"] else "")
        )
        lines.append(f"overhead {gpu['overhead']}")
    header = f"{'kv dtype':<14}{'bytes/token':>14}{'per GPU':>12}{'KiB/token':>11}{'tokens/GiB':>12}{'MiB/request':>13}"
    lines.append(header + (f"{'users':>8}" if gpu else ""))
    for name, row in summary["dtypes"].items():
        per_gib = f"{row['tokens_per_gib']:,.0f}" if row["tokens_per_gib"] else "-"
        lines.append(
            f"{name:<14}{row['bytes_per_token']:>14,.0f}{row['bytes_per_token_per_gpu']:>12,.0f}"
            f"{row['kib_per_token']:>11,.2f}{per_gib:>12}{row['bytes_per_request'] / 2**20:>13,.1f}"
            + (f"{row['users']:>8,}" if gpu else "")
        )
    if summary["cap_tokens"]:
        lines.append(
            f"every layer is windowed: a request stops growing at {summary['cap_tokens']:,} tokens; "
            "bytes/token is the cost per token within the window"
        )
    return "\n".join(lines)


def _csv(summary: dict[str, Any], path: str, force: bool = False) -> None:
    """The per-dtype table at exactly ``path``; an existing file there is kept unless ``force``."""
    import pandas as pd

    target = Path(path)  # a name too long or under a file: refused by its argparse type (limits.output_file)
    if (target.exists() or target.is_symlink()) and not force:
        raise StudyError(f"--csv {path}: exists; refusing to replace it (pick another path, or pass --force)")
    try:
        write_csv(pd.DataFrame.from_dict(summary["dtypes"], orient="index").rename_axis("kv dtype"), target)
    except OSError as exc:  # a parent that is a file, a folder that cannot be made
        raise StudyError(f"--csv {path}: cannot be written ({exc.strerror or exc})") from None


def advised_skip_layers(layout: ModelLayout) -> str | None:
    """The published usage advice (vLLM's FP8 KV-cache update) for a hybrid model, one with both
    sliding-window and full-attention layers: keep the sliding-window layers 16-bit
    (``--kv-cache-dtype-skip-layers sliding_window``). A model whose layers all slide (Mistral-7B-v0.1)
    is not hybrid: the advice does not apply, and FP8 stores every layer."""
    kinds = {layer.kind for layer in layout.layers}
    return "sliding_window" if SLIDING in kinds and kinds & {FULL, MLA} else None


def capacity_facts(
    layout: ModelLayout,
    memory: GpuMemory,
    weights_bytes: int | None,
    overhead_gib: float,
    tensor_parallel_size: int,
    context_len: int,
    skip_layers: str | None,
    kv_memory_gib: float | None,
    compare_tp: list[int],
    baseline_dtype: str = "bfloat16",
) -> dict[str, Any]:
    """What the decision card reads from notebook 01: tokens per GiB and users at ``context_len`` for the
    16-bit baseline and FP8 (with the profile's skip layers, or the advised ones for a hybrid model),
    at the profile's TP, or at the smallest TP of ``compare_tp`` at which the weights fit on this GPU.
    The same functions as 01's tables (``kv_footprint``, ``group_pool``, ``users_at``)."""
    skip = advised_skip_layers(layout) if skip_layers is None else skip_layers
    base = kv_footprint(layout, baseline_dtype, context_len)
    fp8 = kv_footprint(layout, "fp8", context_len, skip)
    saved = base.bytes_per_request - fp8.bytes_per_request  # half of what the layers FP8 stores hold in 16-bit
    facts: dict[str, Any] = {
        "baseline_dtype": base.resolved_dtype,
        "skip_layers": skip,
        "skip_layers_advised": skip_layers is None and skip is not None,
        "tokens_per_gib_baseline": base.tokens_per_gib,
        "tokens_per_gib_fp8": fp8.tokens_per_gib,
        # share of a request's 16-bit KV bytes (state included) held by the layers FP8 stores (1: all, 0: none)
        "fp8_share": min(1.0, 2 * float(saved) / base.bytes_per_request) if base.bytes_per_request > 0 else 0.0,
        "users_baseline": None,
        "users_fp8": None,
        "tp": tensor_parallel_size,
        "kv_pool_gib": None,
        "fits": None,
    }
    if kv_memory_gib is None and weights_bytes is None:
        return facts
    refused = dict(layout.tp_refused)
    sizes = sorted(t for t in {tensor_parallel_size, *compare_tp} if t >= tensor_parallel_size and t not in refused)
    tps = sizes if kv_memory_gib is None else [tensor_parallel_size]
    for tp in tps:
        pool = (  # a KV memory given as such, else what the weights leave (0 when they do not fit)
            int(kv_memory_gib * GIB)
            if kv_memory_gib is not None
            else group_pool(memory, weights_bytes or 0, overhead_gib, tp).kv_pool_bytes
        )
        users = {d: users_at(layout, d, pool, context_len, tp, s) for d, s in ((baseline_dtype, None), ("fp8", skip))}
        if max(users.values()) > 0 or tp == tps[-1]:
            facts.update(
                users_baseline=users[baseline_dtype],
                users_fp8=users["fp8"],
                tp=tp,
                kv_pool_gib=pool / GIB,
                fits=max(users.values()) > 0,
            )
            break
    return facts
