"""The offline retrieval task: its data file, lm-eval reading it, its records, and task selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.accuracy import configurations
from kvstudy.accuracy import records as rec
from kvstudy.accuracy import runner as ge
from kvstudy.errors import StudyError
from kvstudy.io import write_jsonl_atomic
from kvstudy.tools import retrieval_data
from kvstudy.tools.retrieval_data import RetrievalSet, items_for, write_retrieval_data

SMALL = RetrievalSet(lengths=(64, 256), n_per_length=4, questions_per_context=2, n_needles=3)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_data_file_is_deterministic_and_complete(tmp_path):
    a = write_retrieval_data(tmp_path / "a", SMALL)
    b = write_retrieval_data(tmp_path / "b", SMALL)
    assert a.read_bytes() == b.read_bytes()
    items = _lines(a)
    assert len(items) == 2 * 2 * 4  # kinds x lengths x items
    assert {(i["kind"], i["target_tokens"]) for i in items} == {(k, n) for k in ("kv", "needle") for n in (64, 256)}
    for item in items:  # the answer is in the context, next to its key
        key = item["question"].rstrip("?").split()[-1]
        assert key in item["context"] and item["answer"] in item["context"]
    # two questions per context: clusters of two
    clusters = {}
    for item in items:
        clusters.setdefault(item["context_id"], set()).add(item["context"])
    assert all(len(c) == 1 for c in clusters.values()) and len(clusters) == len(items) // 2
    spec = json.loads((tmp_path / "a" / "spec.json").read_text())
    assert spec["items"] == len(items) and spec["contexts"] == len(clusters)
    assert spec["settings"]["lengths"] == [64, 256]


def test_a_different_seed_gives_different_items(tmp_path):
    other = RetrievalSet(lengths=(64,), n_per_length=2, questions_per_context=1, seed=1)
    same = RetrievalSet(lengths=(64,), n_per_length=2, questions_per_context=1, seed=2)
    assert [i["answer"] for i in items_for(other)] != [i["answer"] for i in items_for(same)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lengths": (8,)}, "lengths"),
        ({"n_per_length": 3, "questions_per_context": 2}, "multiple"),
        ({"kinds": ("essay",)}, "kinds"),
    ],
)
def test_bad_sets_are_refused(kwargs, message):
    with pytest.raises(StudyError, match=message):
        RetrievalSet(**kwargs)


def test_task_loads_in_lm_eval_with_the_generators_prompt(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_retrieval_data(tmp_path / "data", SMALL)
    folder = configurations.write_task_folder("retrieval_offline", tmp_path / "data", tmp_path / "task")
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    task = manager.load(["retrieval_offline"])["tasks"]["retrieval_offline"]
    docs = list(task.test_docs())
    items = _lines(tmp_path / "data" / "test.jsonl")
    assert len(docs) == len(items)
    for doc, item in zip(docs, items):
        assert task.doc_to_text(doc) == retrieval_data.prompt_text(item)
        assert task.doc_to_target(doc) == item["answer"]
    assert task.config.generation_kwargs["until"] == ["\n"]
    assert task.config.generation_kwargs["do_sample"] is False
    # the filter is the generator's answer_of: first line, stripped
    ensemble = task._filters[0]
    assert ensemble.name == "answer-line"
    out = list(ensemble.filters[0]().apply([[" 12345 "]], [docs[0]]))
    assert out == [[retrieval_data.answer_of(" 12345 ")]]


def test_missing_retrieval_data_names_the_command(tmp_path):
    with pytest.raises(StudyError, match="retrieval-data"):
        configurations.write_task_folder("retrieval_offline", tmp_path / "none", tmp_path / "task")


def _sample(doc_id: int, item: dict, response: str, right: bool) -> dict:
    return {
        "doc_id": doc_id,
        "doc": item,
        "filter": "answer-line",
        "prompt_hash": f"h{doc_id}",
        "target": item["answer"],
        "resps": [[response]],
        "filtered_resps": [retrieval_data.answer_of(response)],
        "exact_match": float(right),
    }


def test_retrieval_records_keep_length_and_context(tmp_path):
    items = items_for(SMALL)
    samples = [_sample(i, item, f" {item['answer']}" if i % 3 else " 0", bool(i % 3)) for i, item in enumerate(items)]
    records = rec.records_from_samples(samples[::-1], "retrieval_offline")  # any order
    assert [r.doc_id for r in records] == list(range(len(items)))
    for r, item in zip(records, items):
        assert (r.item_id, r.context_id, r.target_tokens, r.kind) == (
            item["id"],
            item["context_id"],
            item["target_tokens"],
            item["kind"],
        )
        assert r.context_tokens == item["context_tokens_approx"] and r.target == item["answer"]
    write_jsonl_atomic(tmp_path / "records.jsonl", records)
    back = rec.read_records(tmp_path / "records.jsonl")
    assert back == records
    assert rec.correctness(back, "answer-line") == {i: bool(i % 3) for i in range(len(items))}
    with pytest.raises(StudyError, match="filter"):
        rec.correctness(back, "strict-match")


def test_a_records_file_mixing_types_is_refused(tmp_path):
    item = items_for(SMALL)[0]
    retrieval = rec.records_from_samples([_sample(0, item, " 1", False)], "retrieval_offline")[0]
    question = rec.QuestionRecord(1, "h", "3", "#### 3", "3", True, "3", True)
    write_jsonl_atomic(tmp_path / "records.jsonl", [retrieval, question])
    with pytest.raises(StudyError, match=r"records.jsonl:2: not an accuracy record \(expected the fields"):
        rec.read_records(tmp_path / "records.jsonl")


def test_samples_without_a_retrieval_doc_are_refused():
    sample = {
        "doc_id": 0,
        "doc": {"question": "q"},
        "filter": "answer-line",
        "resps": [["1"]],
        "filtered_resps": ["1"],
        "exact_match": 0.0,
    }
    with pytest.raises(StudyError, match="doc_id 0 has no retrieval item"):
        rec.records_from_samples([sample], "retrieval_offline")


# --------------------------------------------------------------------------- task selection


def test_for_task_fills_the_tasks_defaults_and_keeps_given_values():
    gsm = ge.EvalSettings.for_task("gsm8k_offline")
    assert gsm == ge.EvalSettings()  # GSM8K's defaults are EvalSettings' own
    ret = ge.EvalSettings.for_task("retrieval_offline", n=10, max_length=None)
    defaults = configurations.TASKS["retrieval_offline"].defaults
    assert ret.task == "retrieval_offline" and ret.n == 10
    assert {k: getattr(ret, k) for k in defaults} == dict(defaults)
    assert ge.EvalSettings.for_task("retrieval_offline", max_gen_toks=32).max_gen_toks == 32


def test_settings_refuse_unknown_tasks_and_foreign_filters():
    with pytest.raises(StudyError, match="task: expected one of"):
        ge.EvalSettings(task="ruler")
    with pytest.raises(StudyError, match="primary_filter: task retrieval_offline"):
        ge.EvalSettings(task="retrieval_offline")  # GSM8K's strict-match is not its filter
    with pytest.raises(StudyError, match="n_questions: unknown field"):
        ge.EvalSettings.for_task("gsm8k_offline", n_questions=3)


def test_every_packaged_task_file_exists_and_names_its_task():
    import yaml

    for spec in configurations.TASKS.values():
        if spec.yaml_file is None:
            continue
        config = yaml.safe_load((configurations.TASK_DIR / spec.yaml_file).read_text())
        assert config["task"] == spec.name
        assert tuple(f["name"] for f in config["filter_list"]) == spec.filters
        assert set(config["dataset_kwargs"]["data_files"]) == set(spec.splits)


def test_cli_runs_the_selected_task(monkeypatch, tmp_path):
    """`kvstudy gsm8k --task retrieval_offline` hands the retrieval settings to the runner."""
    from kvstudy import cli

    seen = {}

    def fake_run(names, model, capture, settings, base, retry_failed=False, screen_top_k=0):
        seen.update(names=names, settings=settings, screen_top_k=screen_top_k)
        return {}

    monkeypatch.setattr(ge, "run_missing", fake_run)
    model = tmp_path / "model"
    model.mkdir()
    code = cli.main(
        [
            "gsm8k",
            "--model",
            str(model),
            "--capture",
            str(tmp_path / "cap"),
            "--configs",
            "bf16,bf16-repeat",
            "--task",
            "retrieval_offline",
            "--n",
            "7",
        ]
    )
    assert code == 1  # nothing ran (the fake), so every configuration is missing
    assert seen["settings"] == ge.EvalSettings.for_task("retrieval_offline", n=7)
    assert seen["names"] == ["bf16", "bf16-repeat"] and seen["screen_top_k"] == 0  # off unless asked


# --------------------------------------------------------------------------- end to end, no vLLM


class _Completions:
    """An OpenAI-style /v1/completions server that answers retrieval prompts from a table:
    the right answer for the items in ``right``, a wrong one for the rest."""

    def __init__(self, answers: dict[str, str], right: set[str]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                if prompts and isinstance(prompts[0], int):  # one tokenized prompt
                    prompts = [prompts]
                choices = []
                for index, prompt in enumerate(prompts):
                    text = prompt if isinstance(prompt, str) else bytes(t for t in prompt if t < 256).decode()
                    outer.prompts.append(text)
                    question = text.rsplit("Question: ", 1)[1].split("\n", 1)[0]
                    answer = answers[question] if question in right else "0"
                    choices.append({"index": index, "text": f" {answer}\n", "finish_reason": "stop"})
                data = json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": choices}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_runner_evaluates_the_retrieval_task_end_to_end(tmp_path, monkeypatch):
    """evaluate_server with task retrieval_offline: lm-eval asks every item with the generator's
    prompt, scores the answer line, and the records keep each item's length and context."""
    pytest.importorskip("lm_eval")
    tokenizer = Path(__file__).resolve().parents[3] / "data" / "trained-model" / "qwen3-mini"
    if not (tokenizer / "tokenizer.json").is_file():
        pytest.skip("the trained model's tokenizer is not there")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_retrieval_data(tmp_path / "data", SMALL)
    items = _lines(tmp_path / "data" / "test.jsonl")
    answers = {i["question"]: i["answer"] for i in items}
    right = {i["question"] for n, i in enumerate(items) if n % 3 != 1}
    server = _Completions(answers, right)
    try:
        settings = ge.EvalSettings.for_task("retrieval_offline", data_dir=str(tmp_path / "data"))
        records = ge.evaluate_server(server.url, "m", tokenizer, tmp_path / "cfg", settings)
    finally:
        server.close()
    assert sorted(server.prompts) == sorted(retrieval_data.prompt_text(i) for i in items)
    assert [r.item_id for r in records] == [i["id"] for i in items]
    assert [r.is_correct for r in records] == [i["question"] in right for i in items]
    assert [r.context_id for r in records] == [i["context_id"] for i in items]
    assert all(r.answer == r.response.strip() for r in records)
    scores = json.loads((tmp_path / "cfg" / "results.json").read_text())["scores"]
    assert scores["exact_match,answer-line"] == pytest.approx(sum(r.is_correct for r in records) / len(records))
    assert rec.read_records(tmp_path / "cfg" / "records.jsonl") == records
