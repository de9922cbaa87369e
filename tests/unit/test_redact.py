"""Secrets redacted by name and by value, in mappings, argument lists and free text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstudy.errors import StudyError
from kvstudy.redact import REDACTED, check_env_mapping, is_secret_name, redact, redact_text, resolve_env, scrub

SECRET = "s3cr3t-Value-42"


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
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["max_tokens", "--max-num-batched-tokens", "num_key_value_heads", "kv_cache_dtype", "tokenizer", "MODEL", "author"],
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
    }
    out = redact(env)
    assert SECRET not in repr(out)
    assert out["PLAIN"] == "x" and out["nested"]["n"] == 1
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
