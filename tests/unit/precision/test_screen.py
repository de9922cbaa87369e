"""kv-screen against fake OpenAI-compatible servers: the paired rows, and one line for each bad input."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.errors import StudyError
from kvstudy.precision import analysis, prompts, records, screen


class Fake:
    """A character-level 'model' behind /v1/models, /tokenize and /v1/completions."""

    def __init__(
        self, root: str = "models/m", max_model_len: int = 8192, logprobs: bool = True, split: int = 1
    ) -> None:
        self.root, self.max_model_len, self.logprobs, self.split = root, max_model_len, logprobs, split

    def tokens(self, text: str) -> list[str]:
        return [text[i : i + self.split] for i in range(0, len(text), self.split)]

    def answer(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/v1/models":
            return {"data": [{"id": "m", "root": self.root, "max_model_len": self.max_model_len}]}
        if path == "/tokenize":
            return {"count": len(self.tokens(body["prompt"])) + 1, "max_model_len": self.max_model_len, "tokens": []}
        toks = self.tokens(body["prompt"])
        if not self.logprobs:
            return {"choices": [{"text": body["prompt"], "logprobs": None}]}
        values = [None] + [-0.1 * (i % 7) for i in range(1, len(toks))]
        tops = [None] + [{t: v, "x": v - 1.0} for t, v in zip(toks[1:], values[1:])]
        return {
            "choices": [
                {"text": body["prompt"], "logprobs": {"tokens": toks, "token_logprobs": values, "top_logprobs": tops}}
            ]
        }


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(fake: Fake) -> str:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(fake.answer(self.path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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


PROMPTS = prompts.gsm8k_prompts(3) + prompts.retrieval_prompts([64], 2)


def test_two_equal_servers_make_no_claim(serve: Any, tmp_path: Path) -> None:
    a, b = serve(Fake()), serve(Fake())
    screen.screen(a, b, tmp_path / "cap", PROMPTS)
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
        screen.screen(a, b, tmp_path / "cap", PROMPTS)
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
        screen.screen("http://127.0.0.1:9", "http://127.0.0.1:9", tmp_path / "c", PROMPTS)


def test_reference_span() -> None:
    assert screen.reference_span(["<s>", "ab", " c", "d"], " cd") == 2
    with pytest.raises(StudyError):
        screen.reference_span(["a"], "abc")
