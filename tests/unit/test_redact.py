"""Secrets redacted by name and by value, in mappings, argument lists and free text; a child's
output copied to a file scrubbed line by line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.errors import StudyError
from kvstudy.redact import (
    REDACTED,
    check_env_mapping,
    copy_scrubbed,
    is_secret_name,
    literal_secrets,
    redact,
    redact_shapes,
    redact_text,
    resolve_env,
    safe_environment,
    scrub,
    scrub_file,
    start_scrubbed_copy,
)

SECRET = "s3cr3t-Value-42"
HANG_S = 60  # generous bounds: they only catch a hang or a survivor


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "passwd",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "Authorization",
        "Cookie",
        "PRIVATE_KEY",
        "--api-key",
        "--hf_token",
        "VLLM_API_KEY",
        "AUTH_TOKEN_HEADER",
        "--token-headers",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens",
        "--max-num-batched-tokens",
        "num_key_value_heads",
        "kv_cache_dtype",
        "tokenizer",
        "MODEL",
        "author",
        "qwen3-mini/int8-token-head",
    ],
)
def test_harmless_names(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", SECRET],
        ["--api_key", SECRET],
        ["--API-KEY", SECRET],
        ["--api-key=" + SECRET],
        ["--hf-token", SECRET],
        ["--hf-token=" + SECRET],
        ["--x", "1", "--auth-token", SECRET],
    ],
)
def test_argument_lists_in_any_spelling(args: list[str]) -> None:
    out = redact(args)
    assert SECRET not in " ".join(out) and len(out) == len(args)


def test_other_arguments_are_kept() -> None:
    args = ["--max-num-batched-tokens", "2048", "--seed", "3", "--block-size", "16"]
    assert redact(args) == args


def test_mappings_by_name_and_by_value() -> None:
    env = {
        "HF_TOKEN": SECRET,
        "HF_ENDPOINT": f"https://user:{SECRET}@hub.example",
        "DATABASE_URL": f"postgres://admin:{SECRET}@host/db",
        "PLAIN": "x",
        "OPENAI_API_KEY": {"from_env": "OPENAI_API_KEY"},
        "nested": {"password": SECRET, "n": 1},
        "items": {"qwen3-mini/int8-token-head": "ok"},  # a capture item named after its KV format
    }
    out = redact(env)
    assert SECRET not in repr(out)
    assert out["PLAIN"] == "x" and out["nested"]["n"] == 1
    assert out["items"] == {"qwen3-mini/int8-token-head": "ok"}
    assert out["OPENAI_API_KEY"] == {"from_env": "OPENAI_API_KEY"}  # a reference holds no secret
    assert out["HF_ENDPOINT"] == f"https://user:{REDACTED}@hub.example"


@pytest.mark.parametrize(
    "text",
    [
        f"curl -H 'Authorization: Bearer {SECRET}'",
        f"HF_TOKEN={SECRET} vllm serve",
        f"non-default args: {{'api_key': ['{SECRET}'], 'model': '/m'}}",
        f"--api-key {SECRET}",
        "token hf_abcdefghijklmnop",
        "key sk-abcdefghijklmnop",
        "AKIAABCDEFGHIJKLMNOP",
        "ghp_abcdefghijklmnopqrst",
        f"redis://:{SECRET}@localhost:6379",
    ],
)
def test_free_text(text: str) -> None:
    out = redact_text(text)
    for secret in (
        SECRET,
        "hf_abcdefghijklmnop",
        "sk-abcdefghijklmnop",
        "AKIAABCDEFGHIJKLMNOP",
        "ghp_abcdefghijklmnopqrst",
    ):
        assert secret not in out


def test_log_lines_without_secrets_are_unchanged() -> None:
    line = "INFO GPU KV cache size: 24,096 tokens; Maximum concurrency for 4,096 tokens per request: 5.88x"
    assert redact_text(line) == line


def test_scrub_removes_literal_values_of_any_shape() -> None:
    assert "opaque-123456" not in scrub("echo opaque-123456", ["opaque-123456"])


def test_from_env_is_resolved_only_on_request() -> None:
    env = check_env_mapping({"HF_TOKEN": {"from_env": "MY_TOKEN"}, "A": "1"}, "server_env")
    assert resolve_env(env, {"MY_TOKEN": SECRET}) == {"HF_TOKEN": SECRET, "A": "1"}
    with pytest.raises(StudyError, match="MY_TOKEN: not set"):
        resolve_env(env, {})


@pytest.mark.parametrize("env", [["A=1"], {"A": 1}, {"A": {"from_env": "X", "b": 1}}, {"1A": "x"}, "A=1"])
def test_bad_env_mappings(env: object) -> None:
    with pytest.raises(StudyError):
        check_env_mapping(env, "server_env")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_redact_text_never_fails_and_is_stable(text: str) -> None:
    once = redact_text(text)
    assert redact_text(once) == once


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["--api-key", "--hf-token", "--auth", "--secret"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=6, max_size=30),
)
def test_planted_argument_values_never_survive(flag: str, value: str) -> None:
    assert value not in redact([flag, value]) and value not in redact_text(f"{flag} {value}")
    assert value not in redact([f"{flag}={value}"])


def test_safe_environment_drops_secrets() -> None:
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnop",
        "AWS_SECRET_ACCESS_KEY": "x",
        "MY_PASSWORD": "p",
        "GITHUB_AUTH": "a",
        "OPENAI_API_KEY": "sk-abc",
        "HARMLESS": "hf_abcdefghijklmnopq",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
    }
    assert safe_environment(env) == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def test_literal_secrets_of_an_environment_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTUDY_TEST_SOURCE", "fromEnvValue-1")
    env = {"HF_TOKEN": "tokValue-22", "PLAIN": "notSecret-5", "VLLM_API_KEY": {"from_env": "KVSTUDY_TEST_SOURCE"}}
    args = ["--api-key", "argValue-333", "--hf-token=eqValue-4", "--block-size", "16", "--auth-token", "abc", "--auth"]
    found = literal_secrets({**env, "MY_KEY": "abc"}, args)
    assert set(found) == {"tokValue-22", "fromEnvValue-1", "argValue-333", "eqValue-4"}  # "abc": too short to scrub
    assert [len(v) for v in found] == sorted((len(v) for v in found), reverse=True)


def test_scrub_file_rewrites_what_it_can_read(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("INFO plainValue-77 and --api-key sk-abcdefghij1234\n")
    scrub_file(log, ["plainValue-77"])
    assert log.read_text() == f"INFO {REDACTED} and --api-key {REDACTED}\n"
    big = tmp_path / "big.log"
    big.write_text("INFO plainValue-77\n")
    scrub_file(big, ["plainValue-77"], limit=4)  # over the limit: left as it is
    assert "plainValue-77" in big.read_text()
    scrub_file(tmp_path / "missing.log", ["plainValue-77"])  # nothing to do, no error


def test_copy_scrubs_lines_split_across_reads(tmp_path: Path) -> None:
    """A secret arriving in two writes, a \\r progress line, a long line cut between words, an
    unfinished last line: each reaches the file scrubbed, and everything else byte for byte."""
    read_end, write_end = os.pipe()
    target = tmp_path / "copy.log"
    source = os.fdopen(read_end, "rb")
    copy = start_scrubbed_copy(source, open(target, "wb"), ["plainSecretValue"])
    long_line = b"word " * 40 + b"--api-key plainSecretValue " + b"tail " * 40 + b"\n"
    for part in (
        b"start --api-ke",
        b"y sk-abcdefghij1234 x\nprogress 10%\r",
        b"progress 100%\r\nplainSecret",
        b"Value here\n" + long_line,
        b"\xf0\x9f\x98\x80 emoji, then an unfinished plainSecretValue",
    ):
        os.write(write_end, part)
        time.sleep(0.05)
    deadline = time.monotonic() + HANG_S
    while b"tail \n" not in target.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert b"plainSecretValue" not in target.read_bytes() and b"unfinished" not in target.read_bytes()
    os.close(write_end)
    copy.join(timeout=HANG_S)
    assert not copy.is_alive() and source.closed
    expected = (
        f"start --api-key {REDACTED} x\nprogress 10%\rprogress 100%\r\n{REDACTED} here\n".encode()
        + long_line.replace(b"plainSecretValue", REDACTED.encode())
        + f"\U0001f600 emoji, then an unfinished {REDACTED}".encode()
    )
    assert target.read_bytes() == expected


def _copied_in_pieces(data: bytes, path: Path) -> bytes:
    """``data`` (no line end) through ``copy_scrubbed`` in pieces of at most 80 bytes."""
    read_end, write_end = os.pipe()
    with open(path, "wb") as target:
        os.write(write_end, data)
        os.close(write_end)
        copy_scrubbed(os.fdopen(read_end, "rb"), target, [], piece_bytes=80)
    return path.read_bytes()


def test_long_lines_are_cut_between_words_and_keep_option_and_value_together(tmp_path: Path) -> None:
    line = b"x " * 30 + b"--api-key sk-" + b"A" * 40 + b" more"
    text = _copied_in_pieces(line * 3, tmp_path / "long.log")
    assert b"sk-AAAA" not in text and text.count(REDACTED.encode()) == 3
    assert text == (line * 3).replace(b"sk-" + b"A" * 40, REDACTED.encode())
    # no place between words: cut at the limit, nothing lost
    assert _copied_in_pieces(b"A" * 300, tmp_path / "plain.log") == b"A" * 300
    # else after a byte outside a token's alphabet: a token across the limit is cut nowhere, so it is redacted whole
    token = b"hf_" + b"B" * 30  # bytes 61 to 94 of the line
    line = b"A" * 60 + b"/" + token + b" end"
    text = _copied_in_pieces(line * 2, tmp_path / "token.log")
    assert text == (line * 2).replace(token, REDACTED.encode())


class BrokenTarget:
    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None: ...

    def close(self) -> None: ...


def test_a_failing_log_never_blocks_the_child() -> None:
    """The log cannot be written (disk full): the copy still drains the pipe to its end."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfor _ in range(2000): sys.stdout.write('x' * 4000 + '\\n')"],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    target: Any = BrokenTarget()
    copy = threading.Thread(target=copy_scrubbed, args=(child.stdout, target, []), daemon=True)
    copy.start()
    assert child.wait(timeout=HANG_S) == 0  # 8 MB through a 64 KiB pipe: it would block undrained
    copy.join(timeout=HANG_S)
    assert not copy.is_alive()


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("models/model_hf_AbCdEfGhIjKl0123-v2", "hf_AbCdEfGhIjKl0123"),  # a token inside a folder name
        ("run_sk-AbCdEfGhIjKl0123.log", "sk-AbCdEfGhIjKl0123"),
        ("git+https://user:p4ss@word99@hub.example/repo", "p4ss@word99"),  # an unencoded @ in the password
        ("https://proxy.example/go?to=https://u:innerPw-77@h.example/p", "innerPw-77"),  # a URL in a URL
        ("jdbc:postgresql://h/db?user=a&password=qs3cretValue&ssl=1", "qs3cretValue"),  # a query parameter
        ("see (https://bob:hunter2pass@h.example).", "hunter2pass"),
    ],
)
def test_secrets_inside_longer_strings_are_redacted(text: str, secret: str) -> None:
    clean = redact_text(text)
    assert secret not in clean and REDACTED in clean
    assert not any(part in clean for part in secret.split("@") if len(part) >= 5)


@pytest.mark.parametrize("text", ["enable_hf_transfer", "use_sk-learn", "http://h/?tokens=5&user=a", "me@x.example"])
def test_names_that_only_look_like_secrets_are_kept(text: str) -> None:
    assert redact_text(text) == text


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789/-._ "


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["hf_", "ghp_", "sk-", "github_pat_", "glpat-"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=6, max_size=30),
    st.text(alphabet=_NAME_CHARS + "_", max_size=30),
    st.sampled_from("/-._ "),
    st.text(alphabet=_NAME_CHARS, max_size=30),
)
def test_a_token_inside_any_folder_name_never_survives(
    prefix: str, body: str, before: str, sep: str, after: str
) -> None:
    token = f"{prefix}X9{body}"  # a real token's body mixes case and digits
    text = f"{before}{sep}{token}{after}"  # after a separator (``xhf_...`` is another word)
    assert token not in redact_shapes(text) and token not in redact_text(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789!$%*+-_@:~", min_size=8, max_size=30),
    st.sampled_from(["https://", "git+https://", "postgresql://", "redis://"]),
    st.sampled_from(["", "see ", "url=", "(", "https://proxy.example/?to="]),
    st.sampled_from(["", "/path", ":5432/db", ").", " and more", "?x=1"]),
)
def test_a_url_password_inside_any_longer_text_never_survives(
    user: str, password: str, scheme: str, before: str, after: str
) -> None:
    text = f"{before}{scheme}{user}:{password}@host.example{after}"
    assert f"{scheme}{user}:{REDACTED}@host.example{after}" in redact_shapes(text)
