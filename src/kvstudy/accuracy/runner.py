"""Run lm-eval's ``local-completions`` against served vLLM configurations and keep per-item records.

A :class:`kvstudy.vllm.server.VllmServer` rather than lm-eval's in-process ``vllm`` backend: the
server is started with the same flags, logs and resolved-run record as every other part of the
study (what the A/B guard compares), and the client side works against any OpenAI-compatible server.

A capture folder holds ``manifest.json`` and one sub-folder per configuration: ``status.json``
(ok | failed | incomplete), ``engine.log``, ``resolved_record.json``, ``task/*.yaml`` (the offline
task used), ``records.jsonl`` (:mod:`kvstudy.accuracy.records`), ``results.json`` (lm-eval's
scores), ``lm_eval_cache_rank0.db`` while incomplete, and with ``screen_top_k`` the screen's files
(:mod:`kvstudy.accuracy.screening`).

Resume: lm-eval's request cache (``use_cache``) lives in the configuration's folder, so a re-run
rebuilds the same prompts (same few-shot seed) and sends only the unanswered ones; the cache is
deleted once the records are written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from kvstudy import capture as capture_format
from kvstudy.accuracy import screening as sc
from kvstudy.accuracy.configurations import EvalConfig, configurations, server_config_for, task_spec, write_task_folder
from kvstudy.accuracy.records import AnyRecord, read_records, records_from_samples
from kvstudy.bench.spec import Spec
from kvstudy.capture import now_utc
from kvstudy.errors import StudyError
from kvstudy.io import read_json, strip_ansi, write_json_atomic, write_jsonl_atomic
from kvstudy.model.config_fields import require_live
from kvstudy.progress import Progress

OFFLINE_TASK = "gsm8k_offline"
CACHE_PREFIX = "lm_eval_cache"


# --------------------------------------------------------------------------- eval settings


class EvalSettings(Spec):
    """The eval as asked; fixed before any result is seen (the primary filter too)."""

    n: int = Field(500, gt=0, description="the first n test questions (lm-eval --limit)")
    num_fewshot: int = Field(8, ge=0)
    fewshot_seed: int = 1234  # lm-eval's fewshot_random_seed
    task: str = OFFLINE_TASK  # a name in kvstudy.accuracy.configurations.TASKS; see for_task
    data_dir: str = "data/gsm8k"  # train.jsonl / test.jsonl for the offline task
    max_length: int = 4096  # tokens of context + generation (8-shot needs > 2048)
    max_gen_toks: int = 256
    num_concurrent: int = 1
    max_retries: int = 3
    primary_filter: str = "strict-match"

    @model_validator(mode="after")
    def _task_filter(self) -> Self:
        filters = task_spec(self.task).filters
        if self.primary_filter not in filters:
            raise StudyError(
                f"primary_filter: task {self.task} has filters {filters}, got "
                f"{self.primary_filter!r} (EvalSettings.for_task fills a task's defaults)"
            )
        return self

    @classmethod
    def for_task(cls, task: str = OFFLINE_TASK, **given: Any) -> EvalSettings:
        """Settings for ``task``: its own defaults (configurations.TASKS), then ``given`` (None = default)."""
        chosen = {k: v for k, v in given.items() if v is not None}
        return cls.from_dict({**task_spec(task).defaults, **chosen, "task": task}, "eval settings")


# --------------------------------------------------------------------------- one lm-eval run


class EvalIncomplete(StudyError):
    """lm-eval stopped before every question was answered; the answers so far are cached."""


def evaluate_server(
    base_url: str,
    model_name: str,
    tokenizer: str | Path,
    out_dir: str | Path,
    settings: EvalSettings,
    num_fewshot: int | None = None,
) -> list[AnyRecord]:
    """Run lm-eval against one server and write ``records.jsonl`` and ``results.json``.

    Raises EvalIncomplete (records so far kept in the request cache) if lm-eval fails.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offline = task_spec(settings.task).offline
    if offline:  # nothing on this path needs the hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    include = write_task_folder(settings.task, settings.data_dir, out_dir / "task") if offline else None
    # the offline task alone: indexing lm-eval's thousands of built-in tasks costs a minute here
    manager = TaskManager(include_path=str(include), include_defaults=False) if include else TaskManager()
    shots = settings.num_fewshot if num_fewshot is None else num_fewshot
    cache = out_dir / CACHE_PREFIX
    try:
        result = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "base_url": f"{base_url.rstrip('/')}/v1/completions",
                "model": model_name,
                "tokenizer_backend": "huggingface",
                "tokenizer": str(tokenizer),
                **settings.model_dump(include={"max_length", "max_gen_toks", "num_concurrent", "max_retries"}),
            },
            tasks=[settings.task],
            num_fewshot=shots,
            limit=settings.n,
            log_samples=True,
            task_manager=manager,
            use_cache=str(cache),
            fewshot_random_seed=settings.fewshot_seed,
            verbosity="WARNING",
        )
    except Exception as exc:  # lm-eval or the server failed: keep the cache, report one line
        done = cached_answers(out_dir)
        raise EvalIncomplete(
            f"{out_dir}: lm-eval stopped after {done} cached answers "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); "
            f"re-run to resume"
        ) from exc
    records = records_from_samples(result["samples"][settings.task], settings.task)
    write_jsonl_atomic(out_dir / "records.jsonl", records)
    summary = {
        "task": settings.task,
        "num_fewshot": shots,
        "limit": settings.n,
        "scores": result["results"][settings.task],
        "lm_eval_config": result["config"],
        "lm_eval_version": result.get("lm_eval_version"),
        "date": result.get("date"),
        "n_samples": result.get("n-samples"),
    }
    write_json_atomic(out_dir / "results.json", summary)
    for path in out_dir.glob(f"{CACHE_PREFIX}*.db"):
        path.unlink()
    return records


def cached_answers(out_dir: str | Path) -> int:
    """How many answers lm-eval's request cache in ``out_dir`` holds (0 if none)."""
    import sqlite3

    total = 0
    for path in Path(out_dir).glob(f"{CACHE_PREFIX}*.db"):
        try:
            with sqlite3.connect(path) as con:
                total += con.execute("SELECT COUNT(*) FROM unnamed").fetchone()[0]
        except sqlite3.Error:
            continue
    return total


# --------------------------------------------------------------------------- configurations live


class ConfigResult(Spec):
    """A configuration's ``status.json``; as read from a capture, with its records and resolved record."""

    name: str
    label: str
    state: Literal["ok", "failed", "incomplete", "missing"]
    diagnosis: str | None = None
    server_config: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    num_fewshot: int | None = None
    n_records: int = 0
    finished_at: str | None = None
    records: list[Any] = Field([], exclude=True)  # QuestionRecord or RetrievalRecord, by task
    resolved_record: dict[str, Any] | None = Field(None, exclude=True)


def result_state(folder: Path, settings: EvalSettings, shots: int) -> str | None:
    """The state the done rule (``capture.needs_run``) reads for a configuration: its status's, but
    None (no result) for an "ok" without its records file or run with other settings (questions,
    task, few-shot seed or shots), which then runs again."""
    status = read_status(folder)
    if status is None or status.state != "ok":
        return None if status is None else status.state
    if not (folder / "records.jsonl").is_file():
        return None
    read_records(folder / "records.jsonl")  # a corrupt records file is one line, not a "done"
    wanted = settings.model_dump(include={"n", "task", "fewshot_seed"})
    return "ok" if status.num_fewshot == shots and wanted.items() <= status.settings.items() else None


def run_group(
    configs: Sequence[EvalConfig],
    base: Any,
    capture: Path,
    settings: EvalSettings,
    ready_timeout_s: float = 900.0,
    progress: Progress = print,
    fp8_kv_backend: str | None = None,
    screen_top_k: int = 0,
) -> list[ConfigResult]:
    """Start one server for configurations that share it and evaluate each (a result already
    done kept), then, with ``screen_top_k`` > 0, screen it (``kvstudy.accuracy.screening``); never
    raises for an engine failure (the status records the engine's diagnosis)."""
    from kvstudy.run_record import server_record
    from kvstudy.vllm.server import EngineStartError, VllmServer

    prompts = sc.prompts_for(settings.task, settings.data_dir, settings.n) if screen_top_k else []
    server_cfg = server_config_for(configs[0], base, fp8_kv_backend)
    first = capture / configs[0].name
    first.mkdir(parents=True, exist_ok=True)
    capture_format.keep_old_attempt(first / "engine.log")  # a retry never overwrites an earlier log
    statuses = []
    progress(
        f"starting vLLM for {', '.join(c.name for c in configs)} "
        f"(kv_cache_dtype={server_cfg.kv_cache_dtype}, quantization={server_cfg.quantization})"
    )
    try:
        with VllmServer(server_cfg, first / "engine.log", ready_timeout_s=ready_timeout_s) as srv:
            record = server_record(srv)
            for cfg in configs:
                folder = capture / cfg.name
                write_json_atomic(folder / "resolved_record.json", record)
                shots = settings.num_fewshot if cfg.num_fewshot is None else cfg.num_fewshot
                pending = sc.pending(cfg, folder, screen_top_k, prompts)
                scorer = sc.check_server(srv.base_url, screen_top_k, prompts) if pending else None
                status = _evaluate(cfg, srv, server_cfg, folder, settings, shots, progress)
                if scorer is not None and status.state == "ok":
                    sc.run(scorer, folder, prompts, screen_top_k, progress)
                progress(f"  {cfg.name}: {status.state} ({status.n_records} answers)")
                statuses.append(status)
    except EngineStartError as exc:
        diagnosis = " ".join(str(exc).split("\n")[0].split())
        root = root_error(Path(exc.log_path)) if exc.log_path is not None else None
        if root and root not in diagnosis:
            diagnosis = f"{root} (root error in the engine log); {diagnosis}"
        for cfg in configs[len(statuses) :]:
            shots = settings.num_fewshot if cfg.num_fewshot is None else cfg.num_fewshot
            if result_state(capture / cfg.name, settings, shots) == "ok":  # started only for its screen: kept
                progress(f"  {cfg.name}: answers kept, not screened: failed to start: {diagnosis[:300]}")
                continue
            statuses.append(_write_status(capture / cfg.name, cfg, server_cfg, settings, "failed", diagnosis))
            progress(f"  {cfg.name}: failed to start: {diagnosis[:300]}")
    return statuses


def _evaluate(
    cfg: EvalConfig, srv: Any, server_cfg: Any, folder: Path, settings: EvalSettings, shots: int, progress: Progress
) -> ConfigResult:
    """lm-eval on one configuration (its status written), or its finished result as it was."""
    found = read_status(folder)
    if found and result_state(folder, settings, shots) == "ok":
        progress(f"  {cfg.name}: lm-eval done already, kept")
        return found
    progress(f"  {cfg.name}: lm-eval, {settings.n} questions, {shots}-shot")
    state, diagnosis = "ok", None
    try:
        count = len(
            evaluate_server(srv.base_url, srv.model_name, server_cfg.model, folder, settings, num_fewshot=shots)
        )
    except EvalIncomplete as exc:
        state, diagnosis, count = "incomplete", str(exc), cached_answers(folder)
    return _write_status(folder, cfg, server_cfg, settings, state, diagnosis, num_fewshot=shots, n_records=count)


def _write_status(
    folder: Path,
    cfg: EvalConfig,
    server_cfg: Any,
    settings: EvalSettings,
    state: str,
    diagnosis: str | None,
    **more: Any,
) -> ConfigResult:
    """A configuration's status, finished now, written to ``status.json``."""
    status = ConfigResult.model_validate(
        {
            "name": cfg.name,
            "label": cfg.label,
            "state": state,
            "diagnosis": diagnosis,
            "server_config": server_cfg.to_dict(),
            "settings": settings.model_dump(),
            "finished_at": now_utc(),
            **more,
        }
    )
    write_json_atomic(folder / "status.json", status.model_dump())
    return status


_ERROR_LINE = re.compile(r"\b((?:[A-Z]\w*)?(?:Error|Exception)): (.+)$")
_WRAPPERS = ("WorkerProc initialization failed", "Engine core initialization failed", "EngineCore failed to start")


def root_error(log_path: Path) -> str | None:
    """The first specific exception line in an engine log (wrappers such as 'WorkerProc
    initialization failed' skipped), e.g. 'RuntimeError: _C::static_scaled_fp8_quant() ...'."""
    if not log_path.is_file():
        return None
    for line in log_path.read_text(errors="replace").splitlines():
        line = strip_ansi(line)  # vLLM colours its log when run under a notebook kernel
        if " ERROR " not in line:  # vLLM's log level; warnings may quote error names too
            continue
        match = _ERROR_LINE.search(line)
        if match and not match.group(2).startswith(_WRAPPERS) and "Traceback" not in line:
            return f"{match.group(1)}: {match.group(2).strip()}"[:400]
    return None


def run_missing(
    names: Sequence[str],
    model: str | Path,
    capture: str | Path,
    settings: EvalSettings,
    base: Any | None = None,
    ready_timeout_s: float = 900.0,
    retry_failed: bool = False,
    progress: Progress = print,
    fp8_kv_backend: str | None = None,
    screen_top_k: int = 0,
) -> dict[str, ConfigResult]:
    """Run every named configuration that has no finished records under these settings (nor, with
    ``screen_top_k`` > 0, a finished screen of its server: ``kvstudy.accuracy.screening``)."""
    from kvstudy.vllm.command import ServerConfig

    capture = Path(capture)
    base = replace(base, model=str(model)) if base else ServerConfig(model=str(model))
    inputs = capture_format.model_inputs(model)
    prompts = sc.prompts_for(settings.task, settings.data_dir, settings.n) if screen_top_k else []
    if (capture / capture_format.MANIFEST).is_file():  # never mix two models (or settings) in one capture
        manifest = capture_format.read_manifest(capture)
        if manifest.get("kind") == KIND:  # an older manifest is checked when it is next written
            _check_same(capture, manifest, settings, inputs)
    todo: dict[tuple[str, str | None, int, str | None], list[EvalConfig]] = {}
    for cfg in configurations(names):
        shots = settings.num_fewshot if cfg.num_fewshot is None else cfg.num_fewshot
        folder = capture / cfg.name
        state = result_state(folder, settings, shots)
        if state == "ok" and sc.pending(cfg, folder, screen_top_k, prompts):
            state = None  # answered, not screened yet: its server starts again for the screen alone
        if not capture_format.needs_run(state, retry_failed):  # every experiment's rule
            diagnosis = getattr(read_status(folder), "diagnosis", None) or ""
            progress(
                f"{cfg.name}: " + ("done already" if state == "ok" else f"failed before ({diagnosis[:120]})") + ", kept"
            )
            continue
        todo.setdefault(cfg.server_key(), []).append(cfg)
    if not todo:
        return {}
    require_live(model, lm_eval=True)
    write_manifest(capture, names, model, settings, base, inputs)
    results: dict[str, ConfigResult] = {}
    try:
        for group in todo.values():
            statuses = run_group(
                group, base, capture, settings, ready_timeout_s, progress, fp8_kv_backend, screen_top_k
            )
            results |= {status.name: status for status in statuses}
    finally:  # close this session and record the states the runs left
        manifest = capture_format.read_manifest(capture, KIND)
        capture_format.finish_session(manifest["sessions"][-1])
        _record_states(capture, manifest)
    return results


def read_status(folder: Path) -> ConfigResult | None:
    """A configuration's status.json (None when absent)."""
    path = folder / "status.json"
    return ConfigResult.from_dict(read_json(path), str(path)) if path.is_file() else None


KIND = "kvstudy accuracy runs"


def write_manifest(
    capture: Path,
    names: Sequence[str],
    model: str | Path,
    settings: EvalSettings,
    base: Any,
    inputs: dict[str, Any] | None = None,
) -> None:
    """Write (or extend) the capture's manifest (kvstudy.capture's format): one session per invocation.
    A new capture goes only into a new or empty folder (``capture.check_new_capture``)."""
    capture = capture_format.check_new_capture(capture, own_item=_is_config_folder)
    capture.mkdir(parents=True, exist_ok=True)
    spec = {"settings": settings.model_dump(), "base_server_config": base.to_dict()}
    inputs = inputs or capture_format.model_inputs(model)
    if (capture / capture_format.MANIFEST).is_file():
        manifest = capture_format.read_manifest(capture, KIND)
        _check_same(capture, manifest, settings, inputs)
    else:
        how = "kvstudy.accuracy.runner.run_missing: lm-eval local-completions against kvstudy.vllm.server.VllmServer"
        manifest = capture_format.new_manifest(KIND, spec, f"{how}, one server per configuration", inputs)
    capture_format.start_session(manifest, list(names))
    _record_states(capture, manifest)


def _check_same(capture: Path, manifest: dict[str, Any], settings: EvalSettings, inputs: dict[str, Any]) -> None:
    """Refuse a capture made from another model or with other eval settings (one line)."""
    capture_format.check_inputs(capture, manifest, inputs)
    found = manifest.get("spec")
    then = found.get("settings") if isinstance(found, dict) else None
    if then != settings.model_dump():
        differ = sorted(k for k, v in settings.model_dump().items() if not isinstance(then, dict) or then.get(k) != v)
        raise StudyError(
            f"{capture / capture_format.MANIFEST}: this capture was made with other settings "
            f"({', '.join(differ)} differ); use a new capture folder"
        )


def _record_states(capture: Path, manifest: dict[str, Any]) -> None:
    """Each configuration's state (from its status.json) into the manifest, written atomically."""
    states = {
        p.name: getattr(read_status(p), "state", "missing") for p in sorted(capture.iterdir()) if _is_config_folder(p)
    }
    capture_format.set_items(manifest, states)
    capture_format.write_manifest(capture, manifest)


def _is_config_folder(path: Path) -> bool:
    """Whether ``path`` is a configuration's folder of this runner (it holds a ``status.json``)."""
    return path.is_dir() and (path / "status.json").is_file()


# --------------------------------------------------------------------------- reading a capture


def load_capture(capture: str | Path, names: Sequence[str]) -> dict[str, ConfigResult]:
    """Read each named configuration's status, records and resolved record (missing -> state
    'missing')."""
    capture = Path(capture)
    if not capture.is_dir():
        raise StudyError(f"{capture}: no such capture folder")
    found = {}
    for cfg in configurations(names):
        folder = capture / cfg.name
        status = read_status(folder) or ConfigResult(
            name=cfg.name, label=cfg.label, state="missing", diagnosis="not run"
        )
        rr_path = folder / "resolved_record.json"
        found[cfg.name] = status.model_copy(
            update={
                "label": cfg.label,
                "records": read_records(folder / "records.jsonl") if status.state == "ok" else [],
                "resolved_record": read_json(rr_path) if rr_path.is_file() else None,
            }
        )
    return found
