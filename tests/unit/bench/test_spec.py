"""The declared specs (issue 31): strict types, one bound per field, unknown keys refused, and
every refusal one StudyError line that names the field, for every grid experiment's spec."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.bench.spec import Spec
from kvstudy.context.spec import ContextSweepSpec
from kvstudy.errors import StudyError
from kvstudy.load.spec import LoadSpec
from kvstudy.speed.spec import SweepSpec

BASES: dict[type[Spec], dict[str, Any]] = {
    SweepSpec: {"model": "m", "configurations": [{"name": "auto"}], "cpu_kvcache_space_gib": 1},
    ContextSweepSpec: {"model": "m", "arms": [{"name": "a"}], "lengths": [8, 16], "cpu_kvcache_space_gib": 1},
    LoadSpec: {
        "model": "m",
        "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8"}],
        "seeds": [0],
        "kv_memory_bytes": 10**7,
        "ttft_ms": 1500,
    },
}


def _leaves(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*map(_leaves, typing.get_args(annotation)))
    return {annotation}


def _scalar(annotation: Any) -> type | None:
    """int or float for a field holding one number (optional or not; limits.Number is a float), else None."""
    leaves = _leaves(annotation) - {type(None)}
    return float if leaves in ({float}, {float, int}) else int if leaves == {int} else None


NUMBER_FIELDS = [
    (cls, name, kind)
    for cls in BASES
    for name, field in cls.model_fields.items()
    if (kind := _scalar(field.annotation)) is not None
]
LIST_FIELDS = [
    (cls, name)
    for cls in BASES
    for name, field in cls.model_fields.items()
    if typing.get_origin(field.annotation) is list and name not in ("configurations", "arms", "server_extra_args")
]


def _refused(cls: type[Spec], over: dict[str, Any], field: str) -> str:
    with pytest.raises(StudyError) as err:
        cls.from_dict({**BASES[cls], **over}, where="spec.json")
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"spec.json: {field}"), text
    return text


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__name__)
def test_the_bases_are_valid_and_read_back_from_their_manifest_form(cls: type[Spec]) -> None:
    spec = cls.from_dict(BASES[cls])
    assert cls.from_dict(spec.to_dict()) == spec


def test_every_experiment_has_number_and_list_fields() -> None:
    """The parametrised checks below cover each spec (a broken field finder would check nothing)."""
    assert {c for c, _, _ in NUMBER_FIELDS} == set(BASES) and {c for c, _ in LIST_FIELDS} == set(BASES)
    assert len(NUMBER_FIELDS) >= 30 and any(kind is float for _, _, kind in NUMBER_FIELDS)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.sampled_from(NUMBER_FIELDS),
    st.booleans() | st.text(max_size=6) | st.from_regex(r"\A-?[0-9]{1,6}(\.[0-9]+)?\Z"),
)
def test_a_bool_or_text_where_a_number_goes_is_refused_naming_the_field(case: Any, value: Any) -> None:
    cls, name, _ = case
    _refused(cls, {name: value}, name)


@pytest.mark.parametrize(
    "cls, name, kind", [c for c in NUMBER_FIELDS if c[2] is int], ids=lambda c: getattr(c, "__name__", c)
)
def test_an_integer_field_refuses_a_float_and_values_past_its_bound(cls: type[Spec], name: str, kind: type) -> None:
    _refused(cls, {name: 2.0}, name)
    assert "expected less than or equal to" in _refused(cls, {name: 2**80}, name)
    _refused(cls, {name: -1}, name)


@pytest.mark.parametrize(
    "cls, name, kind", [c for c in NUMBER_FIELDS if c[2] is float], ids=lambda c: getattr(c, "__name__", c)
)
def test_a_number_field_refuses_nan_infinity_and_values_past_its_bound(cls: type[Spec], name: str, kind: type) -> None:
    for value in (float("nan"), float("inf"), 1e300, -1.0):
        _refused(cls, {name: value}, name)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    st.sampled_from(LIST_FIELDS),
    st.booleans() | st.integers() | st.text(max_size=6) | st.lists(st.booleans(), min_size=1),
)
def test_a_list_field_refuses_a_scalar_or_booleans(case: Any, value: Any) -> None:
    cls, name = case
    _refused(cls, {name: value}, name)


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__name__)
def test_unknown_keys_and_bad_arms_are_refused_by_name(cls: type[Spec]) -> None:
    arms = "configurations" if cls is SweepSpec else "arms"
    assert _refused(cls, {"colour": 1}, "colour").endswith("unknown field")
    assert "unknown kv_cache_dtype 'fp9'" in _refused(
        cls, {arms: [{"name": "a"}, {"name": "b", "kv_cache_dtype": "fp9"}]}, f"{arms}[1].kv_cache_dtype"
    )
    _refused(cls, {arms: [{"name": "a"}, {"name": "a"}]}, arms)
    _refused(cls, {arms: [{"name": "a b"}, {"name": "c"}]}, f"{arms}[0].name")
    _refused(cls, {arms: [{"name": "a", "env": {"K": ["x"]}}, {"name": "b"}]}, f"{arms}[0].env")
    assert "'--port' is set by the project" in _refused(
        cls, {arms: [{"name": "a", "extra_args": ["--port=80"]}, {"name": "b"}]}, f"{arms}[0].extra_args"
    )
    assert "is refused" in _refused(cls, {"server_env": {"VLLM_HOST_IP": "1.2.3.4"}}, "server_env")
    _refused(cls, {"seeds": [1, 1]}, "seeds")
    _refused(cls, {"model": ""}, "model")


@pytest.mark.parametrize(
    "cls, over, words",
    [
        (SweepSpec, {"cpu_kvcache_space_gib": None}, "no fixed KV pool"),
        (SweepSpec, {"max_model_len": 100}, "max_model_len 100 is shorter than input_len + output_len = 1152"),
        (SweepSpec, {"seeds": list(range(5000)), "users": list(range(1, 30))}, "145,000 cells"),
        (ContextSweepSpec, {"cpu_kvcache_space_gib": None}, "no fixed KV pool"),
        (ContextSweepSpec, {"max_model_len": 20}, "below the longest length + output_len = 80"),
        (ContextSweepSpec, {"lengths": [8]}, "lengths: expected at least 2 items"),
        (ContextSweepSpec, {"output_len": 2}, "output_len: expected greater than or equal to 3"),
        (LoadSpec, {"ttft_ms": None}, "no latency target"),
        (LoadSpec, {"arms": [{"name": "auto"}]}, "arms: expected at least 2 items"),
        (LoadSpec, {"target_share": 1.5}, "target_share: expected less than or equal to 1"),
        (LoadSpec, {"device": "tpu"}, "device: expected 'cpu' or 'cuda'"),
        (LoadSpec, {"server_extra_args": ["--max-num-seqs", "8"]}, "sets --max-num-seqs"),
        (LoadSpec, {"kv_memory_bytes": None}, "kv_memory_bytes: a required field is missing"),
    ],
)
def test_relations_between_fields_are_refused_in_one_line(cls: type[Spec], over: dict[str, Any], words: str) -> None:
    data = {k: v for k, v in {**BASES[cls], **over}.items() if v is not None}
    with pytest.raises(StudyError) as err:
        cls.from_dict(data, where="spec.json")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_spec_cannot_be_changed_once_built() -> None:
    spec = SweepSpec.from_dict(BASES[SweepSpec])
    with pytest.raises(Exception, match="frozen"):
        spec.users = [0]  # type: ignore[misc]


def test_from_params_takes_none_as_the_declared_default() -> None:
    spec = SweepSpec.from_params(**BASES[SweepSpec], users=None, input_len=None)
    assert (spec.users, spec.input_len) == ([1], 1024)


def test_check_given_checks_only_the_fields_given() -> None:
    SweepSpec.check_given({"input_len": 64, "capture": "x"}, "p")  # model, configurations not given: fine
    with pytest.raises(StudyError, match="^p: input_len: expected a valid integer, got True$"):
        SweepSpec.check_given({"input_len": True}, "p")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from(list(BASES)), st.data())
def test_any_json_gives_a_spec_or_one_line(cls: type[Spec], data: st.DataObject) -> None:
    over = data.draw(st.dictionaries(st.sampled_from(sorted(cls.model_fields)), JSON_VALUES, max_size=5))
    try:
        cls.from_dict({**BASES[cls], **over})
    except StudyError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("cls", list(BASES))
def test_an_arm_name_given_twice_is_refused(cls: type[Spec]) -> None:
    field = "configurations" if cls is SweepSpec else "arms"
    arms = [{"name": "auto"}, {"name": "auto", "kv_cache_dtype": "fp8"}]
    with pytest.raises(StudyError, match=rf"^spec: {field}: \['auto', 'auto'\]: expected no value twice$"):
        cls.from_dict({**BASES[cls], field: arms})
