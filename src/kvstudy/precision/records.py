"""The capture of a KV-precision run on disk, the kv-screen that writes one from two servers, and
the fixed prompts both it and the simulator score (:func:`scored_prompts`).

A ``kv-precision`` capture (``kvstudy.capture`` manifest) holds one folder per **group** (a baseline
arm, an A/A floor arm, candidates): ``group.json`` (``bench.logprobs.Group``), ``<arm>.logp.jsonl`` (per
prompt: ``id``, ``bucket``, ``cluster``, ``prompt_tokens``, ``logp`` of the reference tokens,
``top1``, optionally ``topk``) and optionally ``<arm>.greedy.jsonl`` (``id``, ``gold``, ``answer``,
``correct``). Torch-free.

The screen (e.g. 16-bit KV against FP8 KV) scores each prompt teacher-forced on every server through
:mod:`kvstudy.bench.logprobs`; the baseline is asked twice (or a third server, ``--repeat``, once)
for the 16-bit A/A floor of the same engine. Servers that cannot return the top-k, serve other
models or tokenize a prompt differently are refused before anything is written.

The prompts: GSM8K-format (``bench.logprobs.gsm8k_prompts``: lm-eval's gsm8k prompt, zero-shot,
continued by the worked solution of ``data/gsm8k/test.jsonl``; bucket ``gsm8k``), then generated
retrieval items (``bench.logprobs.retrieval_prompt``), one question per context (so every prompt is
its own cluster); bucket ``retrieval <length>``. Calibration prompts (for scales computed from data)
come from other items: the GSM8K train split and retrieval contexts of another seed, never the
scored ones.

    kvstudy kv-screen --baseline http://127.0.0.1:8000 --candidate http://127.0.0.1:8001 --capture DIR
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstudy.bench.logprobs import (
    DEFAULT_TOP_K,
    GSM8K_TEST,
    Capture,
    Group,
    ScoredPrompt,
    check_prompts,
    check_same_model,
    describe_server,
    gsm8k_prompts,
    retrieval_prompt,
    score_prompt,
)
from kvstudy.capture import MANIFEST, new_manifest, read_manifest, set_items, write_manifest
from kvstudy.errors import StudyError
from kvstudy.io import read_json_object, read_jsonl, write_json_atomic, write_jsonl_atomic
from kvstudy.outputs import check_output_folder, claim_output_folder
from kvstudy.tools import retrieval_data

KIND = "kv-precision"
GROUP_FILE = "group.json"
GROUP = "screen"
GSM8K_TRAIN = "data/gsm8k/train.jsonl"


def claim_capture(
    capture: str | Path, command: str, groups: Sequence[str], force: bool = False, check_only: bool = False
) -> Path:
    """``capture`` as the output folder of ``command`` (``kv-simulate``, ``kv-screen``): new, empty,
    marked by it, or a ``kv-precision`` capture of the same ``groups`` written before folders were
    marked; any other folder only with ``force`` (``outputs.claim_output_folder``; with
    ``check_only`` the checks alone, nothing written)."""

    def written_before(folder: Path) -> bool:
        try:
            manifest = read_manifest(folder)
        except StudyError:
            return False
        spec = manifest.get("spec")
        return manifest.get("kind") == KIND and isinstance(spec, dict) and spec.get("groups") == list(groups)

    claim = check_output_folder if check_only else claim_output_folder
    return claim(capture, command, force, recognise=written_before)


def logp_path(capture: str | Path, group: str, arm: str) -> Path:
    return Path(capture) / group / f"{arm}.logp.jsonl"


def greedy_path(capture: str | Path, group: str, arm: str) -> Path:
    return Path(capture) / group / f"{arm}.greedy.jsonl"


def _row(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict) or not {"id", "bucket", "cluster"} <= set(row):
        raise ValueError("expected an object with id, bucket, cluster")
    return row


def captured_settings(capture: str | Path, run_missing: bool, names: Sequence[str]) -> dict[str, Any]:
    """The values of ``names`` the capture's spec was made with (its manifest's ``spec``); empty when
    the folder holds no capture yet or a live run may add to it (``run_missing``)."""
    if run_missing or not (Path(capture) / MANIFEST).is_file():
        return {}
    spec = read_manifest(capture, KIND).get("spec") or {}
    return {name: spec[name] for name in names if name in spec}


def load(capture: str | Path) -> Capture:
    """Read every group of a ``kv-precision`` capture (one line naming what is missing or wrong)."""
    folder = Path(capture)
    manifest = read_manifest(folder, KIND)
    names = manifest.get("spec", {}).get("groups")
    if not isinstance(names, list) or not names:
        raise StudyError(f"{folder / 'manifest.json'}: spec.groups: expected a non-empty list of group names")
    groups: list[Group] = []
    logp: dict[tuple[str, str], list[dict[str, Any]]] = {}
    greedy: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for name in names:
        where = folder / str(name) / GROUP_FILE
        group = Group.from_dict(read_json_object(where), str(where))
        groups.append(group)
        for arm in (group.baseline, group.floor, *group.candidates):
            logp[(group.name, arm)] = read_jsonl(logp_path(folder, group.name, arm), _row, "a log-p row")
            path = greedy_path(folder, group.name, arm)
            if path.is_file():
                greedy[(group.name, arm)] = read_jsonl(path)
    return Capture(folder, manifest, groups, logp, greedy)


def scored_prompts(
    gsm8k_n: int,
    lengths: Sequence[int],
    per_length: int,
    seed: int = retrieval_data.DEFAULT_SEED,
    chars_per_token: float = 1.0,
    split: str | Path = GSM8K_TEST,
    prefix: str = "gsm8k",
) -> list[ScoredPrompt]:
    """The first ``gsm8k_n`` problems of ``split``, then ``per_length`` retrieval items per length,
    half key/value and half needle (one question per context)."""
    out = gsm8k_prompts(gsm8k_n, split, prefix)
    for length in lengths:
        for kind, count in {"kv": (per_length + 1) // 2, "needle": per_length // 2}.items():
            if count:
                items = retrieval_data.generate_items(
                    kind, [length], count, seed=seed, chars_per_token=chars_per_token, questions_per_context=1
                )
                out += [retrieval_prompt(item, f"-s{seed}") for item in items]
    return out


def screen(
    baseline: str,
    candidate: str,
    capture: str | Path,
    prompts: Sequence[ScoredPrompt],
    repeat: str | None = None,
    allow_other_checkpoint: bool = False,
    candidate_label: str = "candidate",
    force: bool = False,
    top_k: int = DEFAULT_TOP_K,
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
        check_prompts(server, top_k, prompts)
    arms = {"baseline": base, "baseline-repeat": floor, candidate_label: cand}
    rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for prompt in prompts:
        scored = {arm: score_prompt(server, prompt, top_k) for arm, server in arms.items()}
        first = scored["baseline"][1]
        for arm, (row, tokens) in scored.items():
            if tokens != first:
                raise StudyError(
                    f"server {arms[arm].url}: tokenizes prompt {prompt.id} differently from {base.url} "
                    f"({len(tokens)} tokens against {len(first)}): different tokenizers"
                )
            rows[arm].append(row)
    capture = claim_capture(capture, "kv-screen", [GROUP], force)
    buckets = sorted({p.bucket for p in prompts})
    spec = dict(groups=[GROUP], baseline=base.url, candidate=cand.url, repeat=repeat, prompts=len(prompts), top_k=top_k)
    how = "kvstudy kv-screen (teacher-forced log p through /v1/completions)"
    manifest = new_manifest(KIND, {**spec, "buckets": buckets}, how, {"model": base.root})
    engine = f"OpenAI-compatible servers: baseline {base.url}, candidate {cand.url}"
    info = {arm: {"url": s.url, "model": s.model, "root": s.root, "label": arm} for arm, s in arms.items()}
    note = "A/A floor: " + (f"a third server {floor.url}" if repeat else "the baseline server asked again")
    group = Group(GROUP, engine, base.root, "baseline", "baseline-repeat", (candidate_label,), info, (note,))
    write_json_atomic(capture / GROUP / GROUP_FILE, asdict(group))
    for arm, arm_rows in rows.items():
        write_jsonl_atomic(logp_path(capture, GROUP, arm), arm_rows)
    set_items(manifest, {f"{GROUP}/{arm}": "ok" for arm in arms})
    write_manifest(capture, manifest)
    return capture
