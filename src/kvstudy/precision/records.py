"""The capture of a KV-precision run (simulated storage or a screen of two servers), on disk.

A ``kv-precision`` capture (``kvstudy.capture`` manifest) holds one folder per **group** (a baseline
arm, an A/A floor arm, candidates): ``group.json`` (``bench.logprobs.Group``), ``<arm>.logp.jsonl`` (per
prompt: ``id``, ``bucket``, ``cluster``, ``prompt_tokens``, ``logp`` of the reference tokens,
``top1``, optionally ``topk``) and optionally ``<arm>.greedy.jsonl`` (``id``, ``gold``, ``answer``,
``correct``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstudy.bench.logprobs import Capture, Group
from kvstudy.capture import MANIFEST, read_manifest
from kvstudy.errors import StudyError
from kvstudy.io import read_json_object, read_jsonl
from kvstudy.outputs import check_output_folder, claim_output_folder

KIND = "kv-precision"
GROUP_FILE = "group.json"


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
