"""Time the KV-scale scan on a generated multi-shard checkpoint of several GB; print seconds and bytes read.

The checkpoint is Llama-8B-shaped (32 layers, 8 KV heads, FP8 k/v scales per layer) and written
into a temporary folder as sparse files: every header and every scale tensor holds real bytes, the
weights are holes. The scan must read only the index, the headers and the scale tensors.
Target (issue 6): under 0.5 s and under 1 MB read.

    .venv/bin/python benchmarks/bench_scales.py [--gib 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvstudy.model.scales import inspect_model

LAYERS = 32
HIDDEN = 4096
KV_HEADS = 8
HEAD_DIM = 128
INTERMEDIATE = 14336
VOCAB = 128256


def layer_tensors(layer: int) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of one decoder layer, BF16 weights plus F32 k/v scales."""
    p = f"model.layers.{layer}."
    kv = KV_HEADS * HEAD_DIM
    return [
        (p + "self_attn.q_proj.weight", "BF16", [HIDDEN, HIDDEN]),
        (p + "self_attn.k_proj.weight", "BF16", [kv, HIDDEN]),
        (p + "self_attn.v_proj.weight", "BF16", [kv, HIDDEN]),
        (p + "self_attn.o_proj.weight", "BF16", [HIDDEN, HIDDEN]),
        (p + "mlp.gate_proj.weight", "BF16", [INTERMEDIATE, HIDDEN]),
        (p + "mlp.up_proj.weight", "BF16", [INTERMEDIATE, HIDDEN]),
        (p + "mlp.down_proj.weight", "BF16", [HIDDEN, INTERMEDIATE]),
        (p + "input_layernorm.weight", "BF16", [HIDDEN]),
        (p + "post_attention_layernorm.weight", "BF16", [HIDDEN]),
        (p + "self_attn.k_scale", "F32", []),
        (p + "self_attn.v_scale", "F32", []),
    ]


def write_sparse_shard(path: Path, tensors: list[tuple[str, str, list[int]]], rng: np.random.Generator) -> int:
    """A safetensors file whose header and scale values are real and whose weights are holes."""
    size_of = {"BF16": 2, "F32": 4}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    scale_bytes: list[tuple[int, bytes]] = []
    for name, dtype, shape in tensors:
        nbytes = int(np.prod(shape, dtype=np.int64)) * size_of[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        if name.endswith("_scale"):
            scale_bytes.append((offset, np.float32(rng.uniform(0.01, 0.1)).tobytes()))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for where, data in scale_bytes:
            fh.seek(start + where)
            fh.write(data)
        fh.truncate(start + offset)
    return start + offset


def build_checkpoint(folder: Path, target_gib: float) -> int:
    """Shards of layers until the total reaches ``target_gib`` (more layers than 32 if needed)."""
    rng = np.random.default_rng(0)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": HIDDEN,
                "num_hidden_layers": LAYERS,
                "num_attention_heads": 32,
                "num_key_value_heads": KV_HEADS,
                "head_dim": HEAD_DIM,
                "intermediate_size": INTERMEDIATE,
                "vocab_size": VOCAB,
                "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"},
            }
        )
    )
    weight_map: dict[str, str] = {}
    total = 0
    shards = 4
    per_shard = LAYERS // shards
    for number in range(shards):
        name = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        tensors = [t for layer in range(number * per_shard, (number + 1) * per_shard) for t in layer_tensors(layer)]
        if number == 0:
            tensors.insert(0, ("model.embed_tokens.weight", "BF16", [VOCAB, HIDDEN]))
        if number == shards - 1:
            tensors += [("model.norm.weight", "BF16", [HIDDEN]), ("lm_head.weight", "BF16", [VOCAB, HIDDEN])]
        total += write_sparse_shard(folder / name, tensors, rng)
        weight_map.update({t[0]: name for t in tensors})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    if total < target_gib * 1024**3:
        raise SystemExit(f"generated only {total / 1024**3:.2f} GiB, below the {target_gib} GiB asked")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="minimum checkpoint size on disk (apparent)")
    parser.add_argument("--repeats", type=int, default=5, help="timed scans")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvstudy-bench-scales-") as tmp:
        folder = Path(tmp)
        total = build_checkpoint(folder, args.gib)
        allocated = sum(p.stat().st_blocks * 512 for p in folder.iterdir())
        print(
            f"checkpoint: {len(list(folder.glob('*.safetensors')))} shards, {total / 1024**3:.2f} GiB apparent, "
            f"{allocated / 1024**2:.2f} MiB allocated (sparse)"
        )
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            report = inspect_model(folder)
            times.append(time.perf_counter() - start)
        if report.errors or len(report.scales) != 2 * LAYERS:
            print(f"scan wrong: {len(report.scales)} scales, errors {report.errors}", file=sys.stderr)
            return 1
        print(f"scan: {len(report.scales)} k/v scales from {len(report.files_read)} files")
        print(
            f"seconds: first {times[0]:.4f}, median {statistics.median(times):.4f}, max {max(times):.4f} (target < 0.5)"
        )
        print(f"bytes read: {report.bytes_read} ({report.bytes_read / 1024:.1f} KiB; target < 1 MB = 1,000,000)")
        ok = max(times) < 0.5 and report.bytes_read < 1_000_000
        print("targets met" if ok else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
