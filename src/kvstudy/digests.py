"""Digests of files and folders, for provenance and the done rule: files are read in chunks, and
weight files contribute their size and safetensors header, never their tensors."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import check_regular_file

CHUNK_BYTES = 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _update_with_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)


def _update_with_weights(digest: Any, path: Path) -> None:
    """A weight file's size and, for safetensors, its header: enough to tell checkpoints apart."""
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    if path.suffix != ".safetensors" or size < 8:
        return
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        digest.update(fh.read(min(n, 64 * 1024 * 1024, size - 8)))


def file_digest(path: str | Path, weights_headers_only: bool = True) -> str:
    """Short sha256 of a file, or of a folder's regular files in name order, read in chunks.

    Weight files (``WEIGHT_SUFFIXES``) contribute their name, size and safetensors header unless
    ``weights_headers_only`` is False, so digesting a model folder never reads its tensors.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        files = sorted(
            (p for p in path.rglob("*") if p.is_file() and not p.is_symlink()), key=lambda p: str(p.relative_to(path))
        )
    else:
        files = [check_regular_file(path)]
    try:
        for file in files:
            digest.update(file.name.encode())
            if weights_headers_only and file.suffix in WEIGHT_SUFFIXES:
                _update_with_weights(digest, file)
            else:
                _update_with_file(digest, file)
    except (OSError, struct.error) as exc:
        raise StudyError(f"{path}: cannot digest ({exc})") from None
    return digest.hexdigest()[:12]


def weights_digest(files: Iterable[Path]) -> str | None:
    """A cheap identity of a set of weight files: names, sizes and safetensors headers (None if none)."""
    files = sorted(files)
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        try:
            _update_with_weights(digest, file)
        except (OSError, struct.error):
            continue
    return digest.hexdigest()[:12]
