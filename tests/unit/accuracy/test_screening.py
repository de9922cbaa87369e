"""The accuracy runs' screen of their own servers (kvstudy.accuracy.screening): its prompts, resume,
the done rule with the screen on, and the pairing of its arms by notebook 07's analysis."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.accuracy import runner as ge
from kvstudy.accuracy import screening as sc
from kvstudy.bench.logprobs import Server
from kvstudy.errors import StudyError
from kvstudy.io import write_jsonl_atomic
from kvstudy.precision import analysis

SERVER = Server("http://127.0.0.1:9", "m", "models/m", 8192)


def test_gsm8k_prompts_are_the_questions_asked_with_the_reference_solutions():
    found = sc.prompts_for("gsm8k_offline", "data/gsm8k", 5)
    items = [json.loads(line) for line in Path("data/gsm8k/test.jsonl").read_text().splitlines()[:5]]
    assert [(p.prompt, p.continuation) for p in found] == [
        (f"Question: {i['question']}\nAnswer:", " " + i["answer"]) for i in items
    ]
    assert len({p.cluster for p in found}) == 5  # each question its own cluster


def test_retrieval_prompts_are_the_task_items_clustered_on_their_context():
    items = [json.loads(line) for line in Path("data/retrieval/test.jsonl").read_text().splitlines()[:12]]
    found = sc.prompts_for("retrieval_offline", "data/retrieval", 12)
    assert [p.id for p in found] == [i["id"] for i in items]
    assert [p.cluster for p in found] == [i["context_id"] for i in items]
    assert [p.bucket for p in found] == [f"retrieval {i['target_tokens']}" for i in items]
    assert all(
        p.prompt.endswith(i["answer_prefix"]) and p.continuation == " " + i["answer"] for p, i in zip(found, items)
    )


def test_a_hub_task_is_refused():
    with pytest.raises(StudyError, match="screen_top_k: task gsm8k reads its questions from the hub"):
        sc.prompts_for("gsm8k", "data/gsm8k", 3)


def _row(prompt: Any, shift: float = 0.0, echo: str = "e") -> dict[str, Any]:
    """A screen row of three reference tokens whose top-3 moves by ``shift`` (0: identical arms)."""
    probs = [0.6 - shift, 0.3 + shift, 0.05]
    top = [[7, math.log(probs[0])], [8, math.log(probs[1])], [9, math.log(probs[2])]]
    return {
        "id": prompt.id,
        "bucket": prompt.bucket,
        "cluster": prompt.cluster,
        "prompt_tokens": 5,
        "logp": [math.log(probs[0])] * 3,
        "top1": ["7"] * 3,
        "topk": [top] * 3,
        "echo_sha256": echo,
    }


def _scorer(calls: list[str], fail_after: int | None = None, shift: float = 0.0) -> Any:
    def score(server: Server, prompt: Any, top_k: int) -> tuple[dict[str, Any], list[str]]:
        if fail_after is not None and len(calls) >= fail_after:
            raise StudyError("server gone")
        calls.append(prompt.id)
        return _row(prompt, shift), ["a", "b"]

    return score


def test_an_interrupted_screen_resumes_and_keeps_what_it_scored(tmp_path, monkeypatch):
    items = sc.prompts_for("gsm8k_offline", "data/gsm8k", 6)
    calls: list[str] = []
    monkeypatch.setattr(sc, "score_prompt", _scorer(calls, fail_after=4))
    with pytest.raises(StudyError, match="server gone"):
        sc.run(SERVER, tmp_path, items, 20, progress=lambda line: None)
    assert sc.state(tmp_path, 20, items) is None and len(calls) == 4
    (tmp_path / sc.PARTIAL).write_text((tmp_path / sc.PARTIAL).read_text() + '{"id": "cut off mid-wr')
    monkeypatch.setattr(sc, "score_prompt", _scorer(calls))
    sc.run(SERVER, tmp_path, items, 20, progress=lambda line: None)
    assert calls == [p.id for p in items]  # the first four were not scored again
    assert sc.state(tmp_path, 20, items) == "ok" and not (tmp_path / sc.PARTIAL).exists()
    assert [r["id"] for r in map(json.loads, (tmp_path / sc.ROWS).read_text().splitlines())] == calls
    assert sc.state(tmp_path, 10, items) is None  # another top-k: not this screen
    assert sc.state(tmp_path, 20, items[:5]) is None  # other items: not this screen


def _screened_capture(tmp_path: Path, arms: dict[str, float], **status: Any) -> Path:
    items = sc.prompts_for("gsm8k_offline", "data/gsm8k", 6)
    for name, shift in arms.items():
        folder = tmp_path / name
        folder.mkdir(parents=True)
        rows = [_row(p, shift * (1 + i / 10)) for i, p in enumerate(items)]  # the candidate varies by prompt
        (folder / sc.ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
        info = {"state": "ok", "top_k": 20, "prompts_sha256": "x", "root": "models/m", **status.get(name, {})}
        (folder / sc.STATUS).write_text(json.dumps(info))
    return tmp_path


def test_the_arms_pair_into_kl_delta_logp_and_top1_against_the_floor(tmp_path):
    cap = _screened_capture(tmp_path, {"bf16": 0.0, "bf16-repeat": 0.0, "fp8-kv": 0.1})
    capture = sc.load(cap, ["bf16", "bf16-repeat", "fp8-kv"])
    assert capture is not None
    group = capture.groups[0]
    assert (group.baseline, group.floor, group.candidates, group.model) == ("bf16", "bf16-repeat", ("fp8-kv",), "m")
    table = {r["arm"]: r for r in analysis.comparisons(capture, margin_kl=1.0)}
    assert table["bf16-repeat"]["kl"] == pytest.approx(0.0, abs=1e-12) and table["bf16-repeat"]["top1"] == 1.0
    shifts = [0.1 * (1 + i / 10) for i in range(6)]
    p = [0.6, 0.3, 0.05, 0.05]  # the lumped KL by hand: the top-3 and the rest
    by_hand = [sum(a * math.log(a / b) for a, b in zip(p, [0.6 - s, 0.3 + s, 0.05, 0.05])) for s in shifts]
    assert table["fp8-kv"]["kl"] == pytest.approx(sum(by_hand) / 6)
    assert table["fp8-kv"]["mean"] == pytest.approx(sum(math.log((0.6 - s) / 0.6) for s in shifts) / 6)
    assert table["fp8-kv"]["top1"] == 1.0 and table["fp8-kv"]["equivalence_kl"] == "within"
    beyond = {r["arm"]: r for r in analysis.comparisons(capture, margin_kl=1e-4)}
    assert beyond["fp8-kv"]["equivalence_kl"] == "beyond" and beyond["bf16-repeat"]["equivalence_kl"] == "within"
    facts = analysis.screen_facts(capture, None, "not calibrated")
    assert facts["equivalence"] == "undecided" and facts["candidate"] == "FP8 KV cache"


def test_no_screen_without_the_floor_or_a_candidate(tmp_path):
    assert (
        sc.load(_screened_capture(tmp_path / "a", {"bf16": 0.0, "fp8-kv": 0.1}), ["bf16", "bf16-repeat", "fp8-kv"])
        is None
    )
    assert (
        sc.load(_screened_capture(tmp_path / "b", {"bf16": 0.0, "bf16-repeat": 0.0}), ["bf16", "bf16-repeat", "fp8-kv"])
        is None
    )


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ({"fp8-kv": {"root": "models/other"}}, "screened with another model"),
        ({"fp8-kv": {"top_k": 5}}, "screened with another top-k"),
    ],
)
def test_arms_of_two_models_or_top_k_are_refused(tmp_path, status, message):
    cap = _screened_capture(tmp_path, {"bf16": 0.0, "bf16-repeat": 0.0, "fp8-kv": 0.1}, **status)
    with pytest.raises(StudyError, match=message):
        sc.load(cap, ["bf16", "bf16-repeat", "fp8-kv"])


def test_arms_of_two_tokenizers_are_refused(tmp_path):
    cap = _screened_capture(tmp_path, {"bf16": 0.0, "bf16-repeat": 0.0, "fp8-kv": 0.1})
    path = cap / "fp8-kv" / sc.ROWS
    path.write_text(path.read_text().replace('"echo_sha256": "e"', '"echo_sha256": "f"', 1))
    with pytest.raises(StudyError, match="item 'gsm8k-0' tokenized differently from bf16: different tokenizers"):
        sc.load(cap, ["bf16", "bf16-repeat", "fp8-kv"])


def _answered(cap: Path, name: str) -> None:
    folder = cap / name
    folder.mkdir(parents=True)
    settings = {"n": 2, "task": ge.OFFLINE_TASK, "fewshot_seed": 1234}
    status = {"name": name, "label": name, "state": "ok", "num_fewshot": 8, "settings": settings}
    (folder / "status.json").write_text(json.dumps(status))
    (folder / "records.jsonl").write_text("")


def test_an_answered_configuration_without_its_screen_runs_again(tmp_path, monkeypatch):
    settings = ge.EvalSettings(n=2)
    _answered(tmp_path / "cap", "bf16")
    lines: list[str] = []
    assert ge.run_missing(["bf16"], tmp_path / "model", tmp_path / "cap", settings, progress=lines.append) == {}
    assert lines == ["bf16: done already, kept"]  # screen off: done
    lines.clear()
    with pytest.raises(StudyError):  # scheduled: the run needs the engine and a model folder
        ge.run_missing(["bf16"], tmp_path / "model", tmp_path / "cap", settings, progress=lines.append, screen_top_k=20)
    assert not any("kept" in line for line in lines)
    items = sc.prompts_for(settings.task, settings.data_dir, settings.n)
    monkeypatch.setattr(sc, "score_prompt", _scorer([]))
    sc.run(SERVER, tmp_path / "cap" / "bf16", items, 20, progress=lambda line: None)  # the screen, finished
    lines.clear()
    assert (
        ge.run_missing(["bf16"], tmp_path / "model", tmp_path / "cap", settings, progress=lines.append, screen_top_k=20)
        == {}
    )
    assert lines == ["bf16: done already, kept"]


def test_a_top_k_beyond_the_bound_is_one_line(tmp_path, capsys):
    code = cli.main(["gsm8k", "--model", str(tmp_path), "--capture", str(tmp_path / "c"), "--screen-top-k", "101"])
    err = capsys.readouterr().err
    assert code == 2 and "--screen-top-k" in err and "Traceback" not in err and err.count("\n") == 1


def test_the_cli_option_reaches_the_runner(tmp_path, monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(ge, "run_missing", lambda *args, **kw: seen.update(kw) or {})
    (tmp_path / "model").mkdir()
    argv = ["gsm8k", "--model", str(tmp_path / "model"), "--capture", str(tmp_path / "c"), "--screen-top-k", "8"]
    assert cli.main(argv) == 1 and seen["screen_top_k"] == 8  # 1: nothing ran (the fake runner)


def test_a_failed_start_for_the_screen_alone_keeps_the_answers(tmp_path, monkeypatch):
    from kvstudy.accuracy import configurations as cf
    from kvstudy.vllm import server
    from kvstudy.vllm.command import ServerConfig

    class NoStart:
        def __init__(self, *args: Any, **kw: Any) -> None:
            pass

        def __enter__(self) -> Any:
            raise server.EngineStartError("vLLM server exited with code 1")

        def __exit__(self, *args: Any) -> None:
            pass

    monkeypatch.setattr(server, "VllmServer", NoStart)
    settings = ge.EvalSettings(n=2)
    _answered(tmp_path, "bf16")
    before = (tmp_path / "bf16" / "status.json").read_text()
    lines: list[str] = []
    group = [cf.CONFIGURATIONS["bf16"], cf.CONFIGURATIONS["bf16-zero-shot"]]
    out = ge.run_group(group, ServerConfig(model="m"), tmp_path, settings, progress=lines.append, screen_top_k=20)
    assert (tmp_path / "bf16" / "status.json").read_text() == before  # its answers stay ok
    assert [s.name for s in out] == ["bf16-zero-shot"] and out[0].state == "failed"
    assert any(line.startswith("  bf16: answers kept, not screened") for line in lines)


# --------------------------------------------------------------------------- the runner end to end, no vLLM


class _Served:
    """A stand-in for VllmServer: a character-level OpenAI-compatible server (/v1/models, /tokenize and
    teacher-forced /v1/completions with ``prompt_logprobs``) that refuses more than ``max_logprobs``
    as vLLM words it. Only the runner's plumbing is under test here; tests/live runs vLLM itself."""

    max_logprobs = 20
    started: list[str] = []

    def __init__(self, config: Any, log_path: Path, ready_timeout_s: float = 0.0) -> None:
        self.config, self.model_name = config, "m"
        self.started.append(config.kv_cache_dtype)

    def __enter__(self) -> Any:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        limit, sure = self.max_logprobs, 0.7 if self.config.kv_cache_dtype == "auto" else 0.6

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"data": [{"id": "m", "root": "models/m", "max_model_len": 4096}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["prompt"]
                if self.path == "/tokenize":
                    return self._send(200, {"count": len(text)})
                k = body["prompt_logprobs"]
                if k > limit:
                    message = f"Requested prompt logprobs of {k}, which is greater than max allowed: {limit}"
                    return self._send(400, {"error": {"message": message}})
                tops = [None] + [
                    {str(ord(c)): {"logprob": math.log(sure)}, "1": {"logprob": math.log(1 - sure)}} for c in text[1:]
                ]
                logprobs = {"tokens": list(text), "token_logprobs": [None] + [math.log(sure)] * (len(text) - 1)}
                self._send(200, {"choices": [{"logprobs": logprobs, "prompt_logprobs": tops}]})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *args: Any) -> None:
        self.http.shutdown()
        self.http.server_close()


def _no_engine(monkeypatch: Any, evaluated: list[str]) -> None:
    from kvstudy import run_record
    from kvstudy.vllm import server

    def evaluate(url: str, name: str, tokenizer: Any, out_dir: Path, settings: Any, num_fewshot: int = 0) -> list:
        evaluated.append(out_dir.name)
        write_jsonl_atomic(out_dir / "records.jsonl", [])
        return []

    monkeypatch.setattr(server, "VllmServer", _Served)
    monkeypatch.setattr(run_record, "server_record", lambda srv: {"kv_cache_dtype": srv.config.kv_cache_dtype})
    monkeypatch.setattr(ge, "require_live", lambda *args, **kw: None)
    monkeypatch.setattr(ge, "evaluate_server", evaluate)


def test_the_runner_screens_each_server_and_resumes(tmp_path, monkeypatch):
    evaluated: list[str] = []
    _no_engine(monkeypatch, evaluated)
    _Served.started = []
    settings = ge.EvalSettings.for_task("gsm8k_offline", n=3, num_fewshot=0)
    names = ["bf16", "bf16-repeat", "fp8-kv", "random-weights"]
    run = lambda: ge.run_missing(names, tmp_path / "m", tmp_path / "cap", settings, progress=print, screen_top_k=20)  # noqa: E731
    assert {k: s.state for k, s in run().items() if s} == dict.fromkeys(names, "ok")
    assert evaluated == names and _Served.started == ["auto", "auto", "fp8", "auto"]
    assert not (tmp_path / "cap" / "random-weights" / sc.ROWS).exists()  # a weak baseline is not screened
    capture = sc.load(tmp_path / "cap", names[:3])
    assert capture is not None and capture.groups[0].floor == "bf16-repeat"
    assert capture.groups[0].engine == "vLLM, this capture's servers (top-20 prompt log-probabilities)"
    table = {r["arm"]: r for r in analysis.comparisons(capture)}
    assert table["bf16-repeat"]["kl"] == 0.0 and table["fp8-kv"]["mean"] == pytest.approx(math.log(0.6 / 0.7))
    # the screen of one configuration lost: its server starts again for the screen alone, lm-eval is not asked
    (tmp_path / "cap" / "fp8-kv" / sc.STATUS).unlink()
    evaluated.clear()
    _Served.started = []
    assert list(run()) == ["fp8-kv"] and evaluated == [] and _Served.started == ["fp8"]
    assert sc.state(tmp_path / "cap" / "fp8-kv", 20, sc.prompts_for("gsm8k_offline", "data/gsm8k", 3)) == "ok"


def test_a_server_below_the_top_k_is_refused_before_lm_eval(tmp_path, monkeypatch, capsys):
    evaluated: list[str] = []
    _no_engine(monkeypatch, evaluated)
    monkeypatch.setattr(_Served, "max_logprobs", 5)
    (tmp_path / "m").mkdir()
    argv = ["gsm8k", "--model", str(tmp_path / "m"), "--capture", str(tmp_path / "cap"), "--configs", "bf16,fp8-kv"]
    code = cli.main(argv + ["--n", "3", "--shots", "0", "--screen-top-k", "8"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kvstudy: error: server http://127.0.0.1:") and err.count("\n") == 1
    assert "its max_logprobs is 5, below the top-k of 8 asked for" in err
    assert evaluated == [] and not (tmp_path / "cap" / "bf16" / "status.json").exists()  # nothing spent


def test_rows_of_another_top_k_are_not_resumed(tmp_path, monkeypatch):
    items = sc.prompts_for("gsm8k_offline", "data/gsm8k", 4)
    calls: list[str] = []
    monkeypatch.setattr(sc, "score_prompt", _scorer(calls, fail_after=2))
    with pytest.raises(StudyError):
        sc.run(SERVER, tmp_path, items, 20, progress=lambda line: None)
    calls.clear()
    monkeypatch.setattr(sc, "score_prompt", _scorer(calls))
    sc.run(SERVER, tmp_path, items, 10, progress=lambda line: None)
    assert calls == [p.id for p in items] and sc.state(tmp_path, 10, items) == "ok"
