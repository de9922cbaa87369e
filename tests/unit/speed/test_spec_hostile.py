"""Issue 10: every sweep-spec value validated (type, finite, range) with a one-line error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.cli import main as cli_main
from kvstudy.errors import StudyError
from kvstudy.speed.spec import SweepSpec

BASE: dict[str, Any] = {
    "model": "m",
    "configurations": [{"name": "auto"}],
    "seeds": [0],
    "users": [1],
    "input_len": 8,
    "output_len": 4,
    "cpu_kvcache_space_gib": 1,
}


@pytest.mark.parametrize(
    "over, words",
    [
        ({"seeds": 5}, "'seeds' must be a list"),
        ({"seeds": None}, "'seeds' must be a list"),
        ({"seeds": [True]}, "'seeds'"),
        ({"configurations": 5}, "'configurations' must be a non-empty list"),
        ({"model": 5}, "'model'"),
        ({"max_model_len": "4096"}, "'max_model_len' must be an integer"),
        ({"telemetry_interval_s": "x"}, "'telemetry_interval_s' must be a number"),
        ({"cpu_kvcache_space_gib": float("inf")}, "finite"),
        ({"num_gpu_blocks_override": 1.5}, "integer"),
        ({"telemetry_interval_s": float("nan")}, "finite"),
        ({"ready_timeout_s": -5}, "ready_timeout_s"),
        ({"enforce_eager": "no"}, "true or false"),
        ({"warmups_per_user": True}, "warmups_per_user"),
        ({"server_env": ["A=1"]}, "server_env"),
        ({"server_env": {"A": 1}}, "server_env.A"),
        ({"server_extra_args": "--foo"}, "list of strings"),
        ({"server_extra_args": ["--host", "0.0.0.0"]}, "'--host' is set by the project"),
        ({"configurations": [{"name": "a", "extra_args": ["--port=80"]}]}, "'--port' is set by the project"),
        ({"configurations": [{"name": "a", "extra_args": ["--PORT", "80"]}]}, "'--PORT': not an option of vLLM"),
        ({"configurations": [{"name": 5}]}, "'name' must be a string"),
        ({"configurations": [{"name": "a", "env": {"K": ["x"]}}]}, "env.K"),
        ({"num_gpu_blocks_override": 2**80}, "num_gpu_blocks_override"),
    ],
)
def test_bad_values_are_refused(over: dict[str, Any], words: str) -> None:
    with pytest.raises(StudyError, match=words) as err:
        SweepSpec.from_dict({**BASE, **over})
    assert "\n" not in str(err.value)


def test_env_reference_is_accepted_and_kept_in_the_manifest_form() -> None:
    spec = SweepSpec.from_dict({**BASE, "server_env": {"HF_TOKEN": {"from_env": "HF_TOKEN"}}})
    assert spec.to_dict()["server_env"] == {"HF_TOKEN": {"from_env": "HF_TOKEN"}}


def test_manifest_form_holds_no_secret() -> None:
    spec = SweepSpec.from_dict(
        {
            **BASE,
            "server_env": {"OPENAI_API_KEY": "sk-plantedplanted"},
            "configurations": [
                {
                    "name": "a",
                    "env": {"DATABASE_URL": "postgres://a:pw123@h/db"},
                    "extra_args": ["--api-key", "plantedvalue"],
                }
            ],
        }
    )
    text = json.dumps(spec.to_dict())
    assert "sk-plantedplanted" not in text and "pw123" not in text and "plantedvalue" not in text


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"\x00\xff\xfe\x01"), "not UTF-8"),
        (lambda p: (os.symlink(p.with_name("b"), p), os.symlink(p, p.with_name("b"))), "symlink loop"),
        (lambda p: p.write_text("[" * 10000), "nested deeper"),
    ],
)
def test_hostile_spec_files_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, words: str
) -> None:
    spec = tmp_path / "spec.json"
    make(spec)
    assert cli_main(["sweep", str(spec), str(tmp_path / "cap")]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FIELDS = [
    "model",
    "configurations",
    "seeds",
    "users",
    "input_len",
    "output_len",
    "prompts_per_user",
    "warmups_per_user",
    "num_gpu_blocks_override",
    "cpu_kvcache_space_gib",
    "max_model_len",
    "enforce_eager",
    "server_env",
    "server_extra_args",
    "telemetry_interval_s",
    "ready_timeout_s",
    "bench_timeout_s",
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=5))
def test_any_spec_gives_a_spec_or_a_study_error(over: dict[str, Any]) -> None:
    try:
        SweepSpec.from_dict({**BASE, **over})
    except StudyError as exc:
        assert "\n" not in str(exc)
