"""The capture of a KV-precision run (simulated storage or a screen of two servers), on disk.

A ``kv-precision`` capture (``kvstudy.capture`` manifest) holds one folder per **group** (a baseline
arm, an A/A floor arm, candidates): ``group.json`` (:class:`Group`), ``<arm>.logp.jsonl`` (per
prompt: ``id``, ``bucket``, ``cluster``, ``prompt_tokens``, ``logp`` of the reference tokens,
``top1``, optionally ``topk``) and optionally ``<arm>.greedy.jsonl`` (``id``, ``gold``, ``answer``,
``correct``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Group:
    """One comparison: a baseline arm, its A/A floor and the candidates, as one engine ran them."""

    name: str
    engine: str  # "simulated storage (PyTorch), not vLLM's kernels", or the servers' description
    model: str
    baseline: str
    floor: str
    candidates: tuple[str, ...]
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> how it stores K and V
    notes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Group:
        try:
            return cls(**{**data, "candidates": tuple(data["candidates"]), "notes": tuple(data.get("notes") or ())})
        except (KeyError, TypeError) as exc:
            raise StudyError(
                f"{where}: not a group record ({exc}); expected name, engine, model, baseline, floor, candidates"
            ) from None


def logp_path(capture: str | Path, group: str, arm: str) -> Path:
    return Path(capture) / group / f"{arm}.logp.jsonl"


def greedy_path(capture: str | Path, group: str, arm: str) -> Path:
    return Path(capture) / group / f"{arm}.greedy.jsonl"


def _row(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict) or not {"id", "bucket", "cluster"} <= set(row):
        raise ValueError("expected an object with id, bucket, cluster")
    return row


@dataclass
class Capture:
    """A capture read back: its manifest, groups, and each arm's rows."""

    folder: Path
    manifest: dict[str, Any]
    groups: list[Group]
    logp: dict[tuple[str, str], list[dict[str, Any]]]
    greedy: dict[tuple[str, str], list[dict[str, Any]]]


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


def from_arms(
    folder: str | Path,
    baseline: str,
    floor: str,
    candidates: Sequence[str],
    rows: Mapping[str, list[dict[str, Any]]],
    labels: Mapping[str, str],
    model: str,
    engine: str,
    manifest: dict[str, Any] | None = None,
) -> Capture:
    """One group of arms scored elsewhere (an accuracy run's screen of its own servers) as a capture
    the analysis reads: ``rows`` per arm, in this module's row format."""
    arms = {arm: {"label": labels.get(arm, arm)} for arm in (baseline, floor, *candidates)}
    group = Group("screen", engine, model, baseline, floor, tuple(candidates), arms)
    return Capture(Path(folder), manifest or {}, [group], {("screen", a): list(rows[a]) for a in arms}, {})
