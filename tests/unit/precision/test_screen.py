"""kv-screen against fake OpenAI-compatible servers: the paired rows, and one line for each bad input."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.bench import logprobs
from kvstudy.errors import StudyError
from kvstudy.precision import analysis, records


class Fake:
    """A character-level 'model' behind /v1/models, /tokenize and /v1/completions, with vLLM's
    ``prompt_logprobs`` (token id = the character's code point; 30 other ids share the rest)."""

    def __init__(
        self,
        root: str = "models/m",
        max_model_len: Any = 8192,
        logprobs: bool = True,
        split: int = 1,
        max_logprobs: int = 20,
        sure: float = 0.6,
        models_raw: bytes | None = None,
        tokens_as: Any = None,
        raw: dict[str, bytes] | None = None,
    ) -> None:
        self.root, self.max_model_len, self.logprobs, self.split = root, max_model_len, logprobs, split
        self.max_logprobs, self.sure, self.models_raw, self.tokens_as = max_logprobs, sure, models_raw, tokens_as
        self.raw = dict(raw or {})  # path -> the exact bytes answered there

    def tokens(self, text: str) -> list[str]:
        return [text[i : i + self.split] for i in range(0, len(text), self.split)]

    def top(self, token: str, k: int) -> dict[str, dict[str, float]]:
        weights = [0.7**j for j in range(30)]
        probs = {ord(token[0]) + 100_000 * (len(token) - 1): self.sure}
        probs.update({1_000_000 + j: (1 - self.sure) * w / sum(weights) for j, w in enumerate(weights)})
        ranked = sorted(probs.items(), key=lambda kv: -kv[1])
        kept = dict(ranked[:k])
        first = next(iter(probs))
        kept[first] = probs[first]
        return {str(t): {"logprob": math.log(p), "rank": 1, "decoded_token": "?"} for t, p in kept.items()}

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "m", "root": self.root, "max_model_len": self.max_model_len}]}
        if path == "/tokenize":
            return 200, {"count": len(self.tokens(body["prompt"])) + 1, "max_model_len": 8192, "tokens": []}
        k = int(body.get("prompt_logprobs") or 0)
        if k > self.max_logprobs:
            message = f"Requested prompt logprobs of {k}, which is greater than max allowed: {self.max_logprobs}"
            return 400, {"error": {"message": message, "type": "BadRequestError", "code": 400}}
        toks = self.tokens(body["prompt"])
        if not self.logprobs:
            return 200, {"choices": [{"text": body["prompt"], "logprobs": None}]}
        tops = [None] + [self.top(t, k) for t in toks[1:]]
        values = [None] + [math.log(self.sure)] * (len(toks) - 1)
        shown = toks if self.tokens_as is None else [self.tokens_as] * len(toks)
        logprobs = {"tokens": shown, "token_logprobs": values, "top_logprobs": None}
        return 200, {"choices": [{"text": body["prompt"], "logprobs": logprobs, "prompt_logprobs": tops}]}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(fake: Fake) -> str:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: dict[str, Any]) -> None:
                if self.path == "/v1/models" and fake.models_raw is not None:
                    return self._raw(fake.models_raw)
                if self.path in fake.raw and (self.path != "/v1/completions" or "The probe." not in str(body)):
                    return self._raw(fake.raw[self.path])
                code, answer = fake.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _raw(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    if data == b"ENDLESS":  # a body that never ends, as fast as the socket takes it
                        while True:
                            self.wfile.write(b"[" * 65536)
                    elif data == b"TRICKLE":  # one byte now and then, forever
                        while True:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.05)
                    else:
                        self.wfile.write(data)
                except OSError:
                    pass

            def do_GET(self) -> None:  # noqa: N802
                self._reply({})

            def do_POST(self) -> None:  # noqa: N802
                self._reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


PROMPTS = records.scored_prompts(3, [64], 2)


def test_two_equal_servers_make_no_claim(serve: Any, tmp_path: Path) -> None:
    a, b = serve(Fake()), serve(Fake())
    records.screen(a, b, tmp_path / "cap", PROMPTS)
    capture = records.load(tmp_path / "cap")
    rows = capture.logp[("screen", "candidate")]
    assert len(rows) == len(PROMPTS) and len(rows[0]["logp"]) == len(PROMPTS[0].continuation)
    found = analysis.comparisons(capture)
    assert {r["bucket"] for r in found} == {"gsm8k", "retrieval 64"}
    assert all(r["verdict"].startswith("no claim") and r["top1"] == 1.0 for r in found)


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (Fake(root="models/other"), "different models"),
        (Fake(split=2), "different tokenizers"),
        (Fake(max_model_len=100), "longer than the model's limit"),
        (Fake(logprobs=False), "no prompt log-probabilities"),
    ],
)
def test_bad_input_is_one_line_naming_the_server(serve: Any, tmp_path: Path, candidate: Fake, message: str) -> None:
    a, b = serve(Fake()), serve(candidate)
    with pytest.raises(StudyError, match=message) as caught:
        records.screen(a, b, tmp_path / "cap", PROMPTS)
    assert b in str(caught.value) and "\n" not in str(caught.value)


def test_cli_exits_non_zero_with_one_line(serve: Any, tmp_path: Path, capsys: Any) -> None:
    a, b = serve(Fake()), serve(Fake(root="models/other"))
    code = cli.main(
        ["kv-screen", "--baseline", a, "--candidate", b, "--capture", str(tmp_path / "c"), "--gsm8k-n", "1"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("kvstudy: error: server " + b) and "\n" not in err


def test_unreachable_server(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="server http://127.0.0.1:9"):
        records.screen("http://127.0.0.1:9", "http://127.0.0.1:9", tmp_path / "c", PROMPTS)


def test_reference_span() -> None:
    assert logprobs.reference_span(["<s>", "ab", " c", "d"], " cd") == 2
    with pytest.raises(StudyError):
        logprobs.reference_span(["a"], "abc")


def test_top_k_kl_of_proportional_tails_is_the_exact_kl(serve: Any, tmp_path: Path) -> None:
    # both arms: the text's token, then 30 tokens sharing the rest geometrically; the candidate puts
    # 0.3 instead of 0.6 on the text's token. The tails are proportional, so lumping them loses nothing.
    a, b = serve(Fake()), serve(Fake(sure=0.3))
    records.screen(a, b, tmp_path / "cap", PROMPTS, top_k=20)
    capture = records.load(tmp_path / "cap")
    row = capture.logp[("screen", "candidate")][0]
    assert len(row["topk"]) == len(row["logp"]) and len(row["topk"][0]) == 20
    found = analysis.comparisons(capture, margin_kl=0.01)
    exact = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    cand = [r for r in found if r["role"] == "candidate"]
    floor = [r for r in found if r["role"] != "candidate"]
    assert all(abs(r["kl"] - exact) < 1e-9 for r in cand), [r["kl"] for r in cand]
    assert all(r["kl_high"] >= r["kl"] >= r["kl_low"] - 1e-12 for r in cand)
    assert all(r["equivalence_kl"] == "beyond" for r in cand)  # KL 0.17 nats against a margin of 0.01
    assert all(r["kl"] == 0.0 and r["equivalence_kl"] == "within" and r["top1"] == 1.0 for r in floor)


def test_max_logprobs_below_the_top_k_is_refused_before_scoring(serve: Any, tmp_path: Path, capsys: Any) -> None:
    a, b = serve(Fake()), serve(Fake(max_logprobs=5))
    with pytest.raises(StudyError, match=r"max_logprobs is 5, below the top-k of 20 asked for") as caught:
        records.screen(a, b, tmp_path / "cap", PROMPTS, top_k=20)
    assert b in str(caught.value)
    assert not (tmp_path / "cap").exists()
    code = cli.main(["kv-screen", "--baseline", a, "--candidate", b, "--capture", str(tmp_path / "c"), "--top-k", "6"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "max_logprobs is 5" in err and "\n" not in err
    records.screen(a, b, tmp_path / "ok", PROMPTS, top_k=5)  # within the server's limit: scored


@pytest.mark.parametrize(
    ("fake", "message"),
    [
        (Fake(max_model_len="abc"), r"/v1/models data\[0\].max_model_len: expected an integer"),
        (Fake(models_raw=b'{"data": [{"id": "m", "max_model_len": 1e400}]}'), "max_model_len: expected an integer"),
        (Fake(models_raw=b'{"data": [{"id": 5}]}'), r"id: expected a string"),
        (Fake(models_raw=b'{"data": "m"}'), "data: expected a list"),
        (Fake(models_raw=b"[1, 2]"), "expected a JSON object"),
        (Fake(models_raw=b"{" * 5000), "nested deeper"),
        (Fake(models_raw=b"not json"), "malformed JSON"),
        (Fake(tokens_as=7), r"logprobs.tokens\[0\]: expected a valid string, got 7"),
        (Fake(raw={"/tokenize": b'{"count": "abc"}'}), "/tokenize count: expected an integer"),
        (Fake(raw={"/tokenize": b'{"count": 1e400}'}), "/tokenize count: expected an integer"),
        (Fake(raw={"/v1/completions": b'{"choices": []}'}), "choices: expected a list holding a choice object"),
        (Fake(raw={"/v1/completions": b'{"choices": 3}'}), "choices: expected a list"),
        (
            Fake(
                raw={
                    "/v1/completions": b'{"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": [null]}, '
                    b'"prompt_logprobs": [{"x": {"logprob": -1}}]}]}'
                }
            ),
            r"prompt_logprobs\[0\].x.\[key\]: expected to match pattern",
        ),
        (
            Fake(
                raw={
                    "/v1/completions": b'{"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": '
                    b'[null, "x"]}, "prompt_logprobs": [null, {"1": {"logprob": -1}}]}]}'
                }
            ),
            r"token_logprobs\[1\]: expected a valid number",
        ),
        (
            Fake(
                raw={
                    "/v1/completions": b'{"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": '
                    b'[null, -1]}, "prompt_logprobs": [null, {"1": {"logprob": NaN}}]}]}'
                }
            ),
            r"prompt_logprobs\[1\].1.logprob: expected a finite number",
        ),
    ],
)
def test_a_misbehaving_server_is_one_line(serve: Any, tmp_path: Path, fake: Fake, message: str) -> None:
    a, b = serve(Fake()), serve(fake)
    with pytest.raises(StudyError, match=message) as caught:
        records.screen(a, b, tmp_path / "cap", PROMPTS)
    assert b in str(caught.value) and "\n" not in str(caught.value)


def test_an_endless_answer_stops_at_the_size_limit(serve: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(logprobs, "MAX_RESPONSE_BYTES", 1 << 20)
    b = serve(Fake(models_raw=b"ENDLESS"))
    with pytest.raises(StudyError, match="answered more than 1,048,576 bytes"):
        logprobs.describe_server(b)


def test_a_trickling_answer_stops_at_the_deadline(serve: Any, monkeypatch: Any) -> None:
    """The deadline covers the whole answer (a per-read timeout never trips on a trickle): the reader
    is waited for at most the deadline and its 1 s grace, never without a limit."""
    waits: list[float | None] = []

    class Reader(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            waits.append(timeout)
            assert timeout is not None and timeout <= 2.0, f"the reader is waited for {timeout} s"
            super().join(timeout)

    monkeypatch.setattr(logprobs, "MODELS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(logprobs, "threading", type("Threading", (), {"Thread": Reader}))
    b = serve(Fake(models_raw=b"TRICKLE"))
    with pytest.raises(StudyError, match="gave no complete answer within 1 s"):
        logprobs.describe_server(b)
    assert len(waits) == 1


def test_only_http_urls(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="expected an http:// or https:// URL"):
        logprobs.describe_server("file:///etc/passwd")


def test_engine_screen_facts_and_sentence(serve: Any, tmp_path: Path) -> None:
    a, b = serve(Fake()), serve(Fake(sure=0.3))
    capture = records.load(records.screen(a, b, tmp_path / "cap", PROMPTS, candidate_label="fp8-kv", top_k=20))
    exact = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    beyond = analysis.screen_facts(capture, 0.01, "assumed")
    assert beyond["equivalence"] == "beyond" and beyond["kl_mean"] == pytest.approx(exact)
    assert beyond["top1_agreement"] == 1.0 and beyond["simulated"] is False and beyond["floor_kl_mean"] == 0.0
    assert "**beyond**" in analysis.screen_sentence(beyond) and "assumed margin" in analysis.screen_sentence(beyond)
    assert analysis.screen_facts(capture, 1.0, "calibrated")["equivalence"] == "within"
    none = analysis.screen_facts(capture, None, "not calibrated")
    assert none["equivalence"] == "undecided" and "No KL margin (not calibrated)" in analysis.screen_sentence(none)
    with pytest.raises(StudyError, match="margin_state"):
        analysis.screen_facts(capture, 0.01, "guessed")
