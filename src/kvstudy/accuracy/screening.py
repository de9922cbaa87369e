"""The accuracy runs' screen of their own servers: teacher-forced top-k log-probabilities.

While a configuration's server is up for lm-eval, the runner (``screen_top_k`` > 0) scores the
first ``n`` items of the offline task's ``test.jsonl`` zero-shot in the task's own prompt, through
:mod:`kvstudy.bench.logprobs`, continued by the **reference continuation**, not the 16-bit arm's
answer: it is fixed before any arm runs (each arm is screened on its own server, in any order, and
resumes alone), every arm scores the same tokens, and a 16-bit answer would tilt Δ log p against
every other arm. :func:`load` returns the arms as one ``bench.logprobs.Capture`` group, which notebook
07's analysis (:mod:`kvstudy.precision.analysis`) pairs.

Files per configuration: ``screen.logp.jsonl`` (the rows of ``bench.logprobs.score_prompt`` plus
``echo_sha256`` of the echoed tokens, which shows two tokenizers apart), ``screen.json`` (state,
top-k, the prompts' digest, the model) and, while interrupted, ``screen.partial.jsonl``. A result is
done (``capture.needs_run``) only when its screen is too. Only the run's own model at the run's
shots is screened.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.accuracy.configurations import EvalConfig, configurations, task_spec
from kvstudy.bench.logprobs import (
    Capture,
    Group,
    ScoredPrompt,
    Server,
    check_prompts,
    describe_server,
    gsm8k_prompts,
    retrieval_prompt,
    score_prompt,
)
from kvstudy.errors import StudyError
from kvstudy.io import (
    get_field,
    parse_jsonl_text,
    read_json_object,
    read_jsonl,
    read_text_checked,
    write_json_atomic,
    write_jsonl_atomic,
)
from kvstudy.limits import MAX_TOP_K
from kvstudy.progress import Progress

ROWS = "screen.logp.jsonl"
PARTIAL = "screen.partial.jsonl"
STATUS = "screen.json"


def prompts_for(task: str, data_dir: str | Path, n: int) -> list[ScoredPrompt]:
    """The first ``n`` items of the offline task's test split, as the screen scores them."""
    spec = task_spec(task)
    if not spec.offline:
        raise StudyError(
            f"screen_top_k: task {task} reads its questions from the hub; the screen needs a local task "
            "(gsm8k_offline, retrieval_offline), or screen_top_k 0"
        )
    path = Path(data_dir) / "test.jsonl"
    if spec.kind == "gsm8k":
        return gsm8k_prompts(n, path)
    out = []
    item: Any
    for item in read_jsonl(path)[:n]:
        where = f"{path}: item {str(item.get('id') if isinstance(item, dict) else item)[:40]}"
        for name in ("id", "context_id", "context", "question", "answer_prefix", "answer"):
            get_field(item, name, str, where)
        get_field(item, "target_tokens", int, where)
        out.append(retrieval_prompt(item))
    return out


def _digest(prompts: Sequence[ScoredPrompt]) -> str:
    text = json.dumps([[p.id, p.prompt, p.continuation] for p in prompts])
    return hashlib.sha256(text.encode()).hexdigest()


def pending(cfg: EvalConfig, folder: Path, top_k: int, prompts: Sequence[ScoredPrompt]) -> bool:
    """Whether the runner has yet to screen this configuration: a top-k asked for, the run's model
    at the run's shots, and no finished screen of these prompts at this top-k in its folder."""
    return top_k > 0 and cfg.model is None and cfg.num_fewshot is None and state(folder, top_k, prompts) != "ok"


def _read_status(folder: Path) -> dict[str, Any]:
    return read_json_object(folder / STATUS) if (folder / STATUS).is_file() else {}


def state(folder: Path, top_k: int, prompts: Sequence[ScoredPrompt]) -> str | None:
    """ "ok" when the folder holds a finished screen of these prompts at this top-k, else None."""
    status = _read_status(folder)
    wanted = {"state": "ok", "top_k": top_k, "prompts_sha256": _digest(prompts)}
    return "ok" if wanted.items() <= status.items() and (folder / ROWS).is_file() else None


def check_server(url: str, top_k: int, prompts: Sequence[ScoredPrompt]) -> Server:
    """The server, refused (one line) when it cannot return ``top_k`` log-probabilities or hold a
    prompt (asked before lm-eval, so a refusal spends nothing)."""
    if not 1 <= top_k <= MAX_TOP_K:
        raise StudyError(f"screen_top_k: expected 0 (off) or 1 to {MAX_TOP_K}, got {top_k}")
    server = describe_server(url)
    check_prompts(server, top_k, prompts)
    return server


def run(server: Server, folder: Path, prompts: Sequence[ScoredPrompt], top_k: int, progress: Progress) -> None:
    """Score every prompt not scored yet on ``server`` and write the configuration's screen."""
    info = {"state": "incomplete", "top_k": top_k, "prompts": len(prompts), "prompts_sha256": _digest(prompts)}
    status = _read_status(folder)
    if status.get("top_k") != top_k or status.get("prompts_sha256") != info["prompts_sha256"]:
        (folder / PARTIAL).unlink(missing_ok=True)  # scored at another top-k or on other prompts: not this screen's
    rows = {str(r.get("id")): r for r in _partial(folder / PARTIAL) if isinstance(r, dict)}
    info |= {"model": server.model, "root": server.root}
    write_json_atomic(folder / STATUS, info)
    todo = [p for p in prompts if p.id not in rows]
    progress(f"  screen: {len(todo)} of {len(prompts)} items to score, top-{top_k}")
    with (folder / PARTIAL).open("a", encoding="utf-8") as partial:
        for prompt in todo:
            row, tokens = score_prompt(server, prompt, top_k)
            row["echo_sha256"] = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
            rows[prompt.id] = row
            partial.write(json.dumps(row) + "\n")
            partial.flush()
    write_jsonl_atomic(folder / ROWS, [rows[p.id] for p in prompts])
    write_json_atomic(folder / STATUS, {**info, "state": "ok"})
    (folder / PARTIAL).unlink()


def _partial(path: Path) -> list[Any]:
    """The rows an interrupted screen wrote (a last line cut off mid-write is dropped)."""
    if not path.is_file():
        return []
    text = read_text_checked(path)
    return parse_jsonl_text(text[: text.rfind("\n") + 1], path)


def load(capture: str | Path, names: Sequence[str]) -> Capture | None:
    """The finished screens of the named configurations as one group (the first is the baseline, the
    one with ``repeat`` the floor), or None when the baseline, the floor or every candidate lacks one.
    Refused: arms of two models, screened at two top-k or on other items, or whose servers
    tokenized an item differently."""
    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for cfg in configurations(names):
        folder = Path(capture) / cfg.name
        status = _read_status(folder)
        if status.get("state") == "ok" and (folder / ROWS).is_file():
            found[cfg.name] = (status, read_jsonl(folder / ROWS))
    floor = next((c.name for c in configurations(names) if c.repeat and c.name in found), None)
    candidates = tuple(n for n in found if n not in (names[0], floor))
    if names[0] not in found or floor is None or not candidates:
        return None
    ref, ref_rows = found[names[0]]
    echo = {r.get("id"): r.get("echo_sha256") for r in ref_rows}
    for name, (status, rows) in found.items():
        where = f"{Path(capture) / name / STATUS}"
        for key, what in (("root", "another model"), ("top_k", "another top-k"), ("prompts_sha256", "other items")):
            if status.get(key) != ref.get(key):
                raise StudyError(f"{where}: screened with {what} ({key} {status.get(key)!r}) than {names[0]}")
        other = [r.get("id") for r in rows if echo.get(r.get("id")) != r.get("echo_sha256")]
        if other:
            raise StudyError(f"{where}: item {other[0]!r} tokenized differently from {names[0]}: different tokenizers")
    arms = {c.name: {"label": c.label} for c in configurations(names) if c.name in found}
    engine = f"vLLM, this capture's servers (top-{ref.get('top_k')} prompt log-probabilities)"
    group = Group("screen", engine, str(ref.get("root")).split("/")[-1], names[0], floor, candidates, arms)
    return Capture(Path(capture), {}, [group], {("screen", name): rows for name, (_, rows) in found.items()})
