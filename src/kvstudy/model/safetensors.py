"""Read safetensors files the safe way: the 8-byte header length, the JSON header, then only the
bytes of the tensors asked for (never the whole file, never a pickle).

Problems are reported to a sink (anything with ``errors: list[str]`` and ``bytes_read: int``, such
as a scale report) so that one bad shard does not stop the scan of the others.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvstudy.errors import StudyError
from kvstudy.io import check_regular_file, parse_json_text

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
MAX_SCALE_BYTES = 1024 * 1024  # a KV scale is one value per tensor or per head: far below this
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


class ProblemSink(Protocol):
    """Where readers put what went wrong and how many bytes they read."""

    errors: list[str]
    bytes_read: int


def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """float32 value of every byte of an 8-bit float (e4m3fn: no inf, 0x7f/0xff NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exp = ((codes >> man_bits) & ((1 << exp_bits) - 1)).astype(np.int64)
    man = (codes & ((1 << man_bits) - 1)).astype(np.float64)
    normal = (1.0 + man / (1 << man_bits)) * np.power(2.0, exp - bias)
    subnormal = (man / (1 << man_bits)) * 2.0 ** (1 - bias)
    values = sign * np.where(exp == 0, subnormal, normal)
    top = (1 << exp_bits) - 1
    if fn:
        values[(exp == top) & (man == (1 << man_bits) - 1)] = np.nan
    else:
        values[(exp == top) & (man == 0)] = sign[(exp == top) & (man == 0)] * np.inf
        values[(exp == top) & (man != 0)] = np.nan
    return values.astype(np.float32)


F8_VALUES = {"F8_E4M3": _fp8_table(4, 3, 7, fn=True), "F8_E5M2": _fp8_table(5, 2, 15, fn=False)}


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """Little-endian safetensors bytes of one dtype as float64 values."""
    if dtype in ("F64", "F32", "F16"):
        return np.frombuffer(raw, dtype=f"<f{DTYPE_BYTES[dtype]}").astype(np.float64)
    if dtype == "BF16":
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).astype(np.float64)
    if dtype in F8_VALUES:
        return F8_VALUES[dtype][np.frombuffer(raw, dtype=np.uint8)].astype(np.float64)
    raise ValueError(f"dtype {dtype} is not a float type (expected F32, F16, BF16, F8_E4M3, F8_E5M2 or F64)")


@dataclass
class SafetensorsHeader:
    path: Path
    data_start: int
    size: int
    tensors: dict[str, Any]


def read_header(path: Path, sink: ProblemSink) -> SafetensorsHeader | None:
    """The JSON header of one safetensors file, or None with the reason in ``sink.errors``."""
    try:
        fd = os.open(check_regular_file(path), os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise StudyError(f"{path}: not a regular file (expected a safetensors file)")
            size = st.st_size
            prefix = fh.read(8)
            sink.bytes_read += len(prefix)
            if len(prefix) < 8:
                raise StudyError(
                    f"{path}: truncated safetensors file ({size} bytes; expected an 8-byte header length first)"
                )
            length = int.from_bytes(prefix, "little")
            if length > size - 8:
                raise StudyError(
                    f"{path}: header length {length} is larger than the file "
                    f"({size} bytes); the file is truncated or not safetensors"
                )
            if length > MAX_HEADER_BYTES:
                raise StudyError(
                    f"{path}: header length {length} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes"
                )
            raw = fh.read(length)
            sink.bytes_read += len(raw)
        header = parse_json_text(raw, f"{path}: safetensors header is not valid JSON (truncated or corrupt)")
        if not isinstance(header, dict):
            raise StudyError(f"{path}: safetensors header is not a JSON object")
    except StudyError as exc:
        sink.errors.append(str(exc))
        return None
    except OSError as exc:
        sink.errors.append(f"{path}: cannot read ({exc.strerror or exc})")
        return None
    header.pop("__metadata__", None)
    return SafetensorsHeader(path, 8 + length, size, header)


def read_tensor(header: SafetensorsHeader, name: str, sink: ProblemSink) -> tuple[str, list[int], np.ndarray] | None:
    """The dtype, shape and values of tensor ``name``, or None with the reason in ``sink.errors``."""
    where = f"{header.path}: tensor {name}"
    entry = header.tensors.get(name)
    try:
        if not isinstance(entry, dict):
            raise StudyError(f"{where}: not in this file's header (the index points to the wrong shard)")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or dtype not in DTYPE_BYTES
            or not isinstance(shape, list)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or len(shape) > 8
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48 for x in shape + offsets)
        ):
            raise StudyError(
                f"{where}: header entry {json.dumps(entry)[:200]} is not a float tensor with a shape "
                "and data_offsets [begin, end]"
            )
        begin, end = offsets
        needed = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != needed:
            raise StudyError(f"{where}: data_offsets span {end - begin} bytes, but {dtype} {shape} needs {needed}")
        if end - begin > MAX_SCALE_BYTES:
            raise StudyError(f"{where}: {end - begin} bytes is too large for a KV scale (read skipped)")
        if header.data_start + end > header.size:
            raise StudyError(
                f"{where}: data ends at byte {header.data_start + end}, past the end of the "
                f"file ({header.size} bytes); the shard is truncated"
            )
        with open(check_regular_file(header.path), "rb") as fh:
            fh.seek(header.data_start + begin)
            raw = fh.read(end - begin)
        if len(raw) != end - begin:
            raise StudyError(f"{where}: the file ended early (truncated shard)")
    except OSError as exc:
        sink.errors.append(f"{where}: cannot read ({exc})")
        return None
    except StudyError as exc:
        sink.errors.append(str(exc))
        return None
    sink.bytes_read += len(raw)
    return dtype, shape, decode(raw, dtype)
