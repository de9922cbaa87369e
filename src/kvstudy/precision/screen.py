"""A paired log-probability screen of two OpenAI-compatible servers (e.g. 16-bit KV against FP8 KV).

Each prompt of :mod:`kvstudy.precision.prompts` is scored teacher-forced on every server through
:mod:`kvstudy.bench.logprobs`; the baseline is asked twice (or a third server, ``--repeat``, once)
for the 16-bit A/A floor of the same engine. Servers that cannot return the top-k, serve other
models or tokenize a prompt differently are refused before anything is written.

    kvstudy kv-screen --baseline http://127.0.0.1:8000 --candidate http://127.0.0.1:8001 --capture DIR
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstudy.bench.logprobs import (
    DEFAULT_TOP_K,
    check_length,
    check_same_model,
    check_top_k,
    describe_server,
    score_prompt,
)
from kvstudy.capture import new_manifest, set_items, write_manifest
from kvstudy.errors import StudyError
from kvstudy.io import write_json_atomic, write_jsonl_atomic
from kvstudy.precision import prompts as pr
from kvstudy.precision.records import GROUP_FILE, KIND, Group, claim_capture, logp_path

GROUP = "screen"


def screen(
    baseline: str,
    candidate: str,
    capture: str | Path,
    prompts: Sequence[pr.ScoredPrompt],
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
        check_top_k(server, top_k)
        for prompt in prompts:
            check_length(server, prompt)
    arms = {"baseline": base, "baseline-repeat": floor, candidate_label: cand}
    rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for prompt in prompts:
        first: list[str] | None = None
        for arm, server in arms.items():
            row, tokens = score_prompt(server, prompt, top_k)
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
        "top_k": top_k,
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
    write_json_atomic(capture / GROUP / GROUP_FILE, asdict(group))
    for arm, arm_rows in rows.items():
        write_jsonl_atomic(logp_path(capture, GROUP, arm), arm_rows)
    set_items(manifest, {f"{GROUP}/{arm}": "ok" for arm in arms})
    write_manifest(capture, manifest)
    return capture
