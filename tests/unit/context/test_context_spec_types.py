"""Issue 25: every field of the context sweep spec checked for type and bound (one line each),
before anything runs; the speed spec's counts bounded the same way (``kvstudy.limits``).

Each case below was accepted or gave a traceback before (TypeError on ``lengths: 5``, ``seeds: 3``,
``model: 5``, ``max_model_len: "4096"``; NaN pools, string timeouts, 10**12-token lengths accepted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.cli import main
from kvstudy.context.sweep import ContextSweepSpec
from kvstudy.errors import StudyError
from kvstudy.speed.spec import SweepSpec

BASE: dict[str, Any] = {"model": "m", "arms": [{"name": "a"}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1}
CASES: list[tuple[dict[str, Any], str]] = [
    ({"lengths": 5}, "'lengths' must be a list of integers"),
    ({"lengths": "816"}, "'lengths' must be a list of integers"),
    ({"lengths": [8, True]}, "'lengths'[1] must be an integer"),
    ({"lengths": [8.0, 16]}, "'lengths'[0] must be an integer"),
    ({"lengths": [8, 10**12]}, "above the maximum 10000000"),
    ({"lengths": list(range(1, 20002))}, "expected at most 10,000"),
    ({"seeds": 3}, "'seeds' must be a list of integers"),
    ({"seeds": [0, "1"]}, "'seeds'[1] must be an integer"),
    ({"seeds": list(range(60_000))}, "'seeds' holds 60,000 values, expected at most 10,000"),
    (
        {"seeds": list(range(600)), "lengths": list(range(1, 200))},
        "119,400 cells (arms x seeds x lengths), expected at most 100,000",
    ),
    ({"output_len": "64"}, "'output_len' must be an integer"),
    ({"output_len": 10**9}, "'output_len'"),
    ({"prompts": 2.5}, "'prompts' must be an integer"),
    ({"prompts": 10**8}, "above the maximum"),
    ({"warmups": False}, "'warmups' must be an integer"),
    ({"cpu_kvcache_space_gib": "1"}, "'cpu_kvcache_space_gib' must be a number"),
    ({"cpu_kvcache_space_gib": float("nan")}, "finite"),
    ({"cpu_kvcache_space_gib": 1e300}, "above the maximum"),
    ({"kv_cache_memory_bytes": 1.5}, "'kv_cache_memory_bytes' must be an integer"),
    ({"num_gpu_blocks_override": 2**80}, "'num_gpu_blocks_override'"),
    ({"max_model_len": "4096"}, "'max_model_len' must be an integer"),
    ({"attention_backend": 5}, "'attention_backend'"),
    ({"attention_backend": "TRITON ATTN; rm"}, "'attention_backend'"),
    ({"enforce_eager": "no"}, "'enforce_eager' must be true or false"),
    ({"server_env": "A=1"}, "server_env"),
    ({"server_env": {"A": 1}}, "server_env"),
    ({"ready_timeout_s": "x"}, "'ready_timeout_s' must be a number"),
    ({"ready_timeout_s": float("inf")}, "finite"),
    ({"bench_timeout_s": -1}, "'bench_timeout_s': -1.0 is below the minimum"),
    ({"bench_timeout_s": 10**7}, "above the maximum"),
    ({"model": 5}, "'model' must be a model folder"),
    ({"model": ""}, "'model' must be a model folder"),
    ({"arms": "auto"}, "'arms' must be a list"),
    ({"arms": [{"name": f"a{i}"} for i in range(101)]}, "expected at most 100"),
]


@pytest.mark.parametrize("over, words", CASES, ids=[f"{next(iter(o))}-{i}" for i, (o, _) in enumerate(CASES)])
def test_context_spec_fields_are_checked_for_type_and_bound(over: dict[str, Any], words: str) -> None:
    with pytest.raises(StudyError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as err:
        ContextSweepSpec.from_dict({**BASE, **over})
    assert "\n" not in str(err.value)


def test_the_manifest_form_reads_back() -> None:
    spec = ContextSweepSpec.from_dict({**BASE, "server_env": {"A": "1"}, "attention_backend": "TRITON_ATTN"})
    assert ContextSweepSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("over, words", CASES[:6] + CASES[14:17], ids=[str(i) for i in range(9)])
def test_context_sweep_dry_run_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], over: dict[str, Any], words: str
) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**BASE, **over}))
    assert main(["context-sweep", str(path), str(tmp_path / "cap"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvstudy: error: ") and err.count("\n") == 1 and "Traceback" not in err


SPEED: dict[str, Any] = {"model": "m", "configurations": [{"name": "a"}], "cpu_kvcache_space_gib": 1}


@pytest.mark.parametrize(
    "over, words",
    [
        ({"users": [10**7]}, "'users'\\[0\\]: 10000000 is above the maximum 100000"),
        ({"input_len": 10**9}, "'input_len': 1000000000 is above the maximum 10000000"),
        ({"prompts_per_user": 10**7}, "above the maximum 1000000"),
        ({"seeds": list(range(20_000))}, "holds 20000 values, expected at most 10,000|holds 20,000 values"),
        ({"seeds": list(range(5000)), "users": list(range(1, 30))}, "145,000 cells"),
        ({"configurations": [{"name": f"a{i}"} for i in range(101)]}, "101 configurations, expected at most 100"),
        ({"ready_timeout_s": 1e8}, "above the maximum 604800"),
        ({"cpu_kvcache_space_gib": 1e12}, "above the maximum 1048576"),
    ],
)
def test_speed_spec_counts_are_bounded(over: dict[str, Any], words: str) -> None:
    with pytest.raises(StudyError, match=words):
        SweepSpec.from_dict({**SPEED, **over})


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(sorted(ContextSweepSpec.__dataclass_fields__)), JSON_VALUES, max_size=5))
def test_any_context_spec_gives_a_spec_or_one_line(over: dict[str, Any]) -> None:
    """300 examples, ~2 s: a spec or a StudyError of one line, never another exception."""
    try:
        ContextSweepSpec.from_dict({**BASE, **over})
    except StudyError as exc:
        assert "\n" not in str(exc)
