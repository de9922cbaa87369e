"""Teacher-forced log-probabilities from an OpenAI-compatible server (vLLM's ``prompt_logprobs``):
the one client of every screen (``kvstudy kv-screen`` and the accuracy runs' screen of their own
servers).

A prompt and its reference continuation go to the completions endpoint with ``echo: true,
max_tokens: 0, logprobs: 1, prompt_logprobs: k``: the server scores the text teacher-forced and
returns, per position, the log p of the text's token and of its k most likely tokens by id (facts
in ``kvstudy.vllm.facts``). The reference tokens are the last tokens of the echoed text that cover
the continuation; each gets its log p, its top-k and its most likely token id.

What the screens score (:func:`gsm8k_prompts`, :func:`retrieval_prompt`) and keep (a :class:`Group` of
arms and their rows in a :class:`Capture`) is shared here too: ``kv-screen``, ``kv-simulate`` and the
accuracy runs' screen pair their arms the same way.

Every answer is read within a size limit (``limits.MAX_RESPONSE_BYTES``) and a deadline, and every
field is checked. Refused, with one line naming the server: a server whose ``max_logprobs`` is below
the top-k asked for (a short probe), a prompt longer than the server's limit, an endpoint that
returns no prompt log-probabilities, a field of the wrong kind.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.io import bounded_int, get_field, parse_json_text, type_name
from kvstudy.limits import MAX_RESPONSE_BYTES, MAX_TOKENS
from kvstudy.tools import retrieval_data, train_data
from kvstudy.vllm.facts import DEFAULT_MAX_LOGPROBS, MAX_LOGPROBS_REFUSAL

TIMEOUT_S = 600.0  # one completions answer (a long prompt on 2 CPU cores)
MODELS_TIMEOUT_S = 30.0  # /v1/models and /tokenize
DEFAULT_TOP_K = DEFAULT_MAX_LOGPROBS  # as many as a vLLM server started without --max-logprobs returns
GSM8K_TEST = "data/gsm8k/test.jsonl"


@dataclass(frozen=True)
class ScoredPrompt:
    """One prompt whose reference continuation is scored teacher-forced."""

    id: str
    bucket: str  # "gsm8k" or "retrieval <length>"
    cluster: str  # items sharing a cluster rise and fall together (a context, a question)
    prompt: str
    continuation: str
    gold: str = ""  # the final answer (GSM8K) or value (retrieval), for greedy scoring


@dataclass(frozen=True)
class Server:
    """One OpenAI-compatible server as its ``/v1/models`` describes it."""

    url: str
    model: str
    root: str
    max_model_len: int | None


def _answer_bytes(url: str, path: str, body: dict[str, Any] | None, timeout: float) -> bytes:
    """The body of one answer, read within ``MAX_RESPONSE_BYTES`` and a deadline of ``timeout`` s for
    the whole exchange (a server that trickles or never ends its answer is given up on)."""
    if not url.startswith(("http://", "https://")):
        raise StudyError(f"server {url}: expected an http:// or https:// URL")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + timeout
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = resp.read(MAX_RESPONSE_BYTES + 1)
            if len(data) > MAX_RESPONSE_BYTES:
                result["error"] = f"answered more than {MAX_RESPONSE_BYTES:,} bytes"
            else:
                result["data"] = data
        except urllib.error.HTTPError as exc:
            result["http"] = (exc.code, exc.read(1 << 16).decode("utf-8", errors="replace"))
        except Exception as exc:  # noqa: BLE001 (any failure of the exchange is reported in one line below)
            result["error"] = f"failed ({str(exc)[:200]})"

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()) + 1.0)
    if "http" in result:
        code, detail = result["http"]
        try:
            parsed = parse_json_text(detail, "error")
            message = parsed.get("error", {}).get("message") or detail
        except (StudyError, AttributeError):
            message = detail
        raise StudyError(f"server {url}: {path} answered HTTP {code}: {' '.join(str(message).split())[:300]}")
    if "data" in result:
        return bytes(result["data"])
    why = result.get("error") or f"gave no complete answer within {timeout:g} s"
    raise StudyError(f"server {url}: {path} {why}; expected a running OpenAI-compatible server")


def _request(url: str, path: str, body: dict[str, Any] | None = None, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """One JSON object answered by ``url`` + ``path`` (size limit, deadline, nesting checks)."""
    reply = parse_json_text(_answer_bytes(url, path, body, timeout), f"server {url}: {path}")
    if not isinstance(reply, dict):
        raise StudyError(f"server {url}: {path}: expected a JSON object, got {type_name(reply)}")
    return reply


def describe_server(url: str) -> Server:
    """The first model ``url`` serves, from ``GET /v1/models``, each field checked."""
    where = f"server {url}: /v1/models"
    models = get_field(_request(url, "/v1/models", timeout=MODELS_TIMEOUT_S), "data", list, where)
    if not models or not isinstance(models[0], dict):
        raise StudyError(f"{where}: lists no model (expected data: a list of model objects)")
    card = models[0]
    model = get_field(card, "id", str, where + " data[0]")
    root = get_field(card, "root", (str, type(None)), where + " data[0]", None) or model
    limit = card.get("max_model_len")
    if limit is not None:
        limit = bounded_int(limit, f"{where} data[0].max_model_len", 1, MAX_TOKENS)
    return Server(url, model, root, limit)


def check_same_model(a: Server, b: Server, allow_other_checkpoint: bool = False) -> None:
    """Refuse two servers that serve different models (by the folder or id they loaded)."""
    if a.root != b.root and not allow_other_checkpoint:
        raise StudyError(
            f"server {b.url}: serves {b.root!r}, but server {a.url} serves {a.root!r}: different models "
            "(pass --allow-other-checkpoint to compare two checkpoints of one model)"
        )


def check_prompts(server: Server, top_k: int, prompts: Sequence[ScoredPrompt]) -> None:
    """Refuse a server that cannot return ``top_k`` log-probabilities (:func:`check_top_k`) or hold a
    prompt + continuation (its max_model_len, one token to spare), counted by the server's
    ``/tokenize`` (vLLM; no length check where there is none)."""
    check_top_k(server, top_k)
    limit = server.max_model_len
    if limit is None:
        return
    for prompt in prompts:
        text = prompt.prompt + prompt.continuation
        try:
            body = _request(server.url, "/tokenize", {"model": server.model, "prompt": text})
        except StudyError as exc:
            if "HTTP 404" in str(exc):
                return
            raise
        if "count" not in body:
            return
        count = bounded_int(body["count"], f"server {server.url}: /tokenize count", 0, MAX_TOKENS)
        if count + 1 > limit:
            raise StudyError(
                f"server {server.url}: prompt {prompt.id} has {count} tokens, longer than the model's limit "
                f"(max_model_len {limit}, one token to spare); use shorter retrieval lengths"
            )


def reference_span(tokens: Sequence[str], continuation: str) -> int:
    """Index of the first token of the continuation: the last tokens whose text covers it."""
    covered, index = 0, len(tokens)
    while index > 0 and covered < len(continuation):
        index -= 1
        covered += len(tokens[index])
    if covered < len(continuation):
        raise StudyError(f"echoed text is shorter than the continuation {continuation[:40]!r}")
    return index


LogP = Annotated[float, Field(le=1e-3)]  # a log-probability (vLLM sends -inf as -9999.0)
TokenId = Annotated[str, Field(pattern=r"^\d{1,12}$")]  # prompt_logprobs' keys: token ids as text


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class _Logprob(_Strict):
    logprob: LogP


class _Logprobs(_Strict):
    tokens: list[str] = Field(min_length=1)
    token_logprobs: list[LogP | None]


class _Choice(_Strict):  # prompt_logprobs: per position null or {token id: {logprob, ...}}
    logprobs: _Logprobs
    prompt_logprobs: list[Annotated[dict[TokenId, _Logprob], Field(min_length=1)] | None]


def parse_scores(
    reply: dict[str, Any], where: str
) -> tuple[list[str], list[float | None], list[dict[int, float] | None]]:
    """The echoed tokens, their log p and each position's top-k ({token id: log p}) from a completions
    answer, every field checked (one line naming the field otherwise)."""
    choices = get_field(reply, "choices", list, where)
    if not choices or not isinstance(choices[0], dict):
        raise StudyError(f"{where}: choices: expected a list holding a choice object")
    if not isinstance(choices[0].get("logprobs"), dict) or not isinstance(choices[0].get("prompt_logprobs"), list):
        raise StudyError(
            f"{where}: returned no prompt log-probabilities (echo with logprobs, and vLLM's prompt_logprobs); "
            "this screen needs them"
        )
    try:
        choice = _Choice.model_validate(choices[0])
    except ValidationError as exc:
        raise StudyError(f"{where}: {one_line(exc)}") from None
    tokens, values, tops = choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.prompt_logprobs
    if len(values) != len(tokens) or len(tops) != len(tokens):
        raise StudyError(
            f"{where}: {len(tokens)} tokens but {len(values)} token_logprobs and {len(tops)} prompt_logprobs; "
            "expected one of each per token"
        )
    return tokens, values, [None if t is None else {int(k): v.logprob for k, v in t.items()} for t in tops]


def _body(server: Server, text: str, top_k: int) -> dict[str, Any]:
    return {
        "model": server.model,
        "prompt": text,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "prompt_logprobs": top_k,
        "temperature": 0.0,
    }


def check_top_k(server: Server, top_k: int) -> None:
    """Refuse a server whose ``max_logprobs`` is below ``top_k`` (asked with a short probe, since
    vLLM's /v1/models does not say it)."""
    try:
        _request(server.url, "/v1/completions", _body(server, "The probe.", top_k))  # a first request may be slow
    except StudyError as exc:
        found = re.search(MAX_LOGPROBS_REFUSAL, str(exc))
        if found:
            allowed = found.group(2)
            raise StudyError(
                f"server {server.url}: its max_logprobs is {allowed}, below the top-k of {top_k} asked for; "
                f"start it with --max-logprobs {top_k} or ask a top-k of at most {allowed}"
            ) from None
        raise


def score_prompt(server: Server, prompt: ScoredPrompt, top_k: int) -> tuple[dict[str, Any], list[str]]:
    """One prompt's row (log p of each reference token, the top-k at each of its positions and the
    most likely token id) and the echoed tokens."""
    where = f"server {server.url}: prompt {prompt.id}"
    reply = _request(server.url, "/v1/completions", _body(server, prompt.prompt + prompt.continuation, top_k))
    tokens, values, tops = parse_scores(reply, where)
    start = max(1, reference_span(tokens, prompt.continuation))
    ref, top = values[start:], tops[start:]
    if any(v is None for v in ref) or any(t is None for t in top):
        raise StudyError(f"{where}: some reference tokens have no log-probability; expected one per token")
    topk = [sorted(t.items(), key=lambda kv: -kv[1]) for t in top if t is not None]  # k, or k + 1 with the reference
    row = {
        "id": prompt.id,
        "bucket": prompt.bucket,
        "cluster": prompt.cluster,
        "prompt_tokens": start,
        "logp": [float(v) for v in ref if v is not None],
        "top1": [str(t[0][0]) for t in topk],
        "topk": [[[token, value] for token, value in t] for t in topk],
    }
    return row, tokens


# --------------------------------------------------------------------------- what the screens score and keep


def gsm8k_prompts(n: int, path: str | Path = GSM8K_TEST, prefix: str = "gsm8k") -> list[ScoredPrompt]:
    """The first ``n`` GSM8K-format problems, each its own cluster, in lm-eval's zero-shot gsm8k
    prompt (``Question: {q}\\nAnswer:``) continued by ``" "`` + the worked solution."""
    problems = train_data.read_split(path)[:n] if n else []
    return [
        ScoredPrompt(
            f"{prefix}-{i}",
            "gsm8k",
            f"{prefix}-{i}",
            f"Question: {p.question}\nAnswer:",
            " " + p.answer,
            train_data.final_answer(p.answer),
        )
        for i, p in enumerate(problems)
    ]


def retrieval_prompt(item: dict[str, Any], suffix: str = "") -> ScoredPrompt:
    """A retrieval item (``tools.retrieval_data``) continued by ``" "`` + its value, clustered on its
    context (``suffix`` appended to both ids, e.g. the seed of generated items)."""
    text = retrieval_data.prompt_text(item)
    bucket = f"retrieval {item['target_tokens']}"
    return ScoredPrompt(
        item["id"] + suffix, bucket, item["context_id"] + suffix, text, " " + item["answer"], item["answer"]
    )


@dataclass(frozen=True)
class Group:
    """One comparison: a baseline arm, its A/A floor and the candidates, as one engine ran them."""

    name: str
    engine: str  # "simulated storage (PyTorch), not vLLM's kernels", or the servers' description
    model: str
    baseline: str
    floor: str
    candidates: tuple[str, ...]
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> how it stores K and V, its label
    notes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Group:
        try:
            return cls(**{**data, "candidates": tuple(data["candidates"]), "notes": tuple(data.get("notes") or ())})
        except (KeyError, TypeError) as exc:
            raise StudyError(
                f"{where}: not a group record ({exc}); expected name, engine, model, baseline, floor, candidates"
            ) from None


@dataclass
class Capture:
    """Screened arms read back: the manifest, the groups, and each (group, arm)'s rows (those of
    :func:`score_prompt`, ``greedy``: answers scored right or wrong)."""

    folder: Path
    manifest: dict[str, Any]
    groups: list[Group]
    logp: dict[tuple[str, str], list[dict[str, Any]]]
    greedy: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
