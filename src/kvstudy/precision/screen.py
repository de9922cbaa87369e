"""A paired log-probability screen of two OpenAI-compatible servers (e.g. 16-bit KV against FP8 KV).

Each prompt of ``kvstudy.precision.prompts`` is sent with its reference continuation to the
completions endpoint with ``echo: true, max_tokens: 0, logprobs: 1``: the server scores the text
teacher-forced and returns each token's log p and its most likely token (vLLM 0.32:
``CompletionRequest.to_sampling_params`` turns ``echo`` + ``logprobs`` into ``prompt_logprobs``,
and ``echo`` with ``max_tokens 0`` returns the prompt only; see
``vllm/entrypoints/openai/completion/protocol.py`` and ``serving.py``). The reference tokens are
the last tokens of the echoed text that cover the continuation. The baseline is asked twice (or a
third server, ``--repeat``, once): the 16-bit against 16-bit floor of the same engine.

Refused, with one line naming the server: servers that serve different models (unless
``--allow-other-checkpoint``) or tokenize a prompt differently, a prompt longer than a server's
limit, an endpoint that returns no prompt log-probabilities.

    kvstudy kv-screen --baseline http://127.0.0.1:8000 --candidate http://127.0.0.1:8001 --capture DIR
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstudy.capture import new_manifest, set_items, write_manifest
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_FACTOR, MAX_ITEMS, MAX_TOKENS, float_arg, int_arg, output_folder
from kvstudy.precision import prompts as pr
from kvstudy.precision.records import KIND, Group, claim_capture, write_group, write_logp

GROUP = "screen"
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Server:
    """One OpenAI-compatible server as its ``/v1/models`` describes it."""

    url: str
    model: str
    root: str
    max_model_len: int | None


def _request(url: str, path: str, body: dict[str, Any] | None = None, timeout: float = TIMEOUT_S) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")
        try:
            message = json.loads(detail).get("error", {}).get("message") or detail
        except (ValueError, AttributeError):
            message = detail
        raise StudyError(f"server {url}: {path} answered HTTP {exc.code}: {str(message)[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StudyError(f"server {url}: {path} failed ({exc}); expected a running OpenAI-compatible server") from None


def describe_server(url: str) -> Server:
    """The first model ``url`` serves, from ``GET /v1/models``."""
    body = _request(url, "/v1/models", timeout=30)
    models = body.get("data") if isinstance(body, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise StudyError(f"server {url}: /v1/models lists no model")
    card = models[0]
    limit = card.get("max_model_len")
    return Server(url, str(card["id"]), str(card.get("root") or card["id"]), int(limit) if limit else None)


def check_same_model(a: Server, b: Server, allow_other_checkpoint: bool = False) -> None:
    """Refuse two servers that serve different models (by the folder or id they loaded)."""
    if a.root != b.root and not allow_other_checkpoint:
        raise StudyError(
            f"server {b.url}: serves {b.root!r}, but server {a.url} serves {a.root!r}: different models "
            "(pass --allow-other-checkpoint to compare two checkpoints of one model)"
        )


def _token_count(server: Server, text: str) -> int | None:
    """Tokens of ``text`` by the server's ``/tokenize`` (vLLM), or None where there is none."""
    try:
        body = _request(server.url, "/tokenize", {"model": server.model, "prompt": text}, timeout=60)
    except StudyError as exc:
        if "HTTP 404" in str(exc):
            return None
        raise
    return int(body["count"]) if isinstance(body, dict) and "count" in body else None


def check_length(server: Server, prompt: pr.ScoredPrompt) -> None:
    """Refuse a prompt + continuation the server cannot hold (its max_model_len, one token to spare)."""
    if server.max_model_len is None:
        return
    count = _token_count(server, prompt.prompt + prompt.continuation)
    if count is not None and count + 1 > server.max_model_len:
        raise StudyError(
            f"server {server.url}: prompt {prompt.id} has {count} tokens, longer than the model's limit "
            f"(max_model_len {server.max_model_len}, one token to spare); use shorter retrieval lengths"
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


def score_prompt(server: Server, prompt: pr.ScoredPrompt) -> tuple[dict[str, Any], list[str]]:
    """One prompt's row (log p and top-1 token of each reference token) and the echoed tokens."""
    body = {
        "model": server.model,
        "prompt": prompt.prompt + prompt.continuation,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0.0,
    }
    reply = _request(server.url, "/v1/completions", body)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    logprobs = choices[0].get("logprobs") if choices and isinstance(choices[0], dict) else None
    tokens = (logprobs or {}).get("tokens") or []
    values = (logprobs or {}).get("token_logprobs") or []
    if not tokens or len(values) != len(tokens) or all(v is None for v in values):
        raise StudyError(
            f"server {server.url}: the completions endpoint returned no prompt log-probabilities "
            "(echo: true with logprobs); this screen needs them"
        )
    start = max(1, reference_span(tokens, prompt.continuation))
    tops = (logprobs or {}).get("top_logprobs") or [None] * len(tokens)
    ref = values[start:]
    if any(v is None for v in ref):
        raise StudyError(f"server {server.url}: prompt {prompt.id}: some reference tokens have no log-probability")
    top1 = [max(t.items(), key=lambda kv: kv[1])[0] if isinstance(t, dict) and t else None for t in tops[start:]]
    row = {
        "id": prompt.id,
        "bucket": prompt.bucket,
        "cluster": prompt.cluster,
        "prompt_tokens": start,
        "logp": [float(v) for v in ref],
        "top1": top1 if all(t is not None for t in top1) else None,
    }
    return row, list(tokens)


def screen(
    baseline: str,
    candidate: str,
    capture: str | Path,
    prompts: Sequence[pr.ScoredPrompt],
    repeat: str | None = None,
    allow_other_checkpoint: bool = False,
    candidate_label: str = "candidate",
    force: bool = False,
) -> Path:
    """Score ``prompts`` on every server and write a ``kv-precision`` capture of group ``screen`` (a
    folder kv-screen did not write only with ``force``: ``records.claim_capture``)."""
    if not prompts:
        raise StudyError("kv-screen: no prompts (gsm8k-n and retrieval-per-length are both 0)")
    claim_capture(capture, "kv-screen", [GROUP], force, check_only=True)  # refused before any server is asked
    base = describe_server(baseline)
    cand = describe_server(candidate)
    check_same_model(base, cand, allow_other_checkpoint)
    floor = describe_server(repeat) if repeat else base
    check_same_model(base, floor)
    for server in {s.url: s for s in (base, cand, floor)}.values():
        for prompt in prompts:
            check_length(server, prompt)
    arms = {"baseline": base, "baseline-repeat": floor, candidate_label: cand}
    rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for prompt in prompts:
        first: list[str] | None = None
        for arm, server in arms.items():
            row, tokens = score_prompt(server, prompt)
            if first is not None and tokens != first:
                raise StudyError(
                    f"server {server.url}: tokenizes prompt {prompt.id} differently from {base.url} "
                    f"({len(tokens)} tokens against {len(first)}): different tokenizers"
                )
            first = first if first is not None else tokens
            rows[arm].append(row)
    capture = claim_capture(capture, "kv-screen", [GROUP], force)
    engine = f"OpenAI-compatible servers: baseline {base.url}, candidate {cand.url}"
    spec = {
        "groups": [GROUP],
        "baseline": base.url,
        "candidate": cand.url,
        "repeat": repeat,
        "prompts": len(prompts),
        "buckets": sorted({p.bucket for p in prompts}),
    }
    manifest = new_manifest(
        KIND, spec, "kvstudy kv-screen (teacher-forced log p through /v1/completions)", {"model": base.root}
    )
    group = Group(
        name=GROUP,
        engine=engine,
        model=base.root,
        baseline="baseline",
        floor="baseline-repeat",
        candidates=(candidate_label,),
        arms={arm: {"url": s.url, "model": s.model, "root": s.root, "label": arm} for arm, s in arms.items()},
        notes=("A/A floor: " + (f"a third server {floor.url}" if repeat else "the baseline server asked again"),),
    )
    write_group(capture, group)
    for arm, arm_rows in rows.items():
        write_logp(capture, GROUP, arm, arm_rows)
    set_items(manifest, {f"{GROUP}/{arm}": "ok" for arm in arms})
    write_manifest(capture, manifest)
    return capture


def _cmd(args: argparse.Namespace) -> int:
    from kvstudy.precision.analysis import comparison_table, comparisons
    from kvstudy.precision.records import load

    prompts = pr.gsm8k_prompts(args.gsm8k_n) + pr.retrieval_prompts(
        args.retrieval_lengths, args.retrieval_per_length, chars_per_token=args.chars_per_token
    )
    capture = screen(
        args.baseline, args.candidate, args.capture, prompts, args.repeat, args.allow_other_checkpoint, force=args.force
    )
    table = comparison_table(comparisons(load(capture)))
    print(table.drop(columns=["storage"]).to_string(index=False))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("kv-screen", help="paired teacher-forced log p of two OpenAI-compatible servers")
    p.add_argument("--baseline", required=True, help="URL of the 16-bit server, e.g. http://127.0.0.1:8000")
    p.add_argument("--candidate", required=True, help="URL of the server under test (e.g. FP8 KV)")
    p.add_argument("--repeat", help="URL of a second 16-bit server for the A/A floor (default: the baseline again)")
    p.add_argument("--capture", required=True, type=output_folder, help="capture folder to write")
    p.add_argument("--gsm8k-n", type=int_arg(0, MAX_ITEMS), default=20)
    p.add_argument("--retrieval-lengths", type=int_arg(1, MAX_TOKENS), nargs="*", default=[512, 1024, 2048])
    p.add_argument("--retrieval-per-length", type=int_arg(0, MAX_ITEMS), default=4)
    p.add_argument(
        "--chars-per-token",
        type=float_arg(0.01, MAX_FACTOR),
        default=1.0,
        help="retrieval context characters per token",
    )
    p.add_argument("--allow-other-checkpoint", action="store_true", help="the servers may load different folders")
    p.add_argument("--force", action="store_true", help="write into a folder kv-screen did not create")
    p.set_defaults(func=_cmd)
