"""`kvstudy capacity` run as a user runs it: a subprocess of the installed console command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KVSTUDY = Path(sys.executable).parent / "kvstudy"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(
        [str(KVSTUDY), "capacity", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_json_for_the_study_model() -> None:
    out = run("data/models/Qwen3-8B", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["dtypes"]["bfloat16"]["bytes_per_token"] == 147456
    assert data["dtypes"]["fp8"]["bytes_per_token"] == 73728
    assert data["dtypes"]["nvfp4"]["bytes_per_token"] == 41472
    # default request length: the config's max_position_embeddings (40,960 tokens)
    assert data["context_len"] == 40960
    assert data["dtypes"]["fp8"]["bytes_per_request"] == 73728 * 40960


def test_json_chosen_dtypes_length_and_skip_layers() -> None:
    out = run(
        "data/models/gpt-oss-20b/config.json",
        "--kv-dtype",
        "auto",
        "fp8",
        "--max-model-len",
        "1000",
        "--skip-layers",
        "sliding_window",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data["dtypes"]) == ["auto", "fp8"]
    assert data["dtypes"]["auto"]["resolved_dtype"] == "bfloat16"  # no torch_dtype: served in bf16
    # 12 full layers in fp8 x 1,000 tokens + 12 sliding bf16 layers x window 128, 1,024 B/token/layer fp8
    assert data["dtypes"]["fp8"]["bytes_per_request"] == 12 * 1024 * 1000 + 12 * 2048 * 128
    assert data["layer_kinds"] == {"full_attention": 12, "sliding_attention": 12}


def test_human_table() -> None:
    out = run("data/models/Qwen3-8B", "--max-model-len", "8192")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Qwen3-8B (qwen3, 36 full_attention)")
    row = next(line for line in lines if line.startswith("fp8"))
    # bytes/token, bytes/token on one GPU (TP 1: the same), KiB/token, tokens/GiB
    assert row.split()[1:5] == ["73,728", "73,728", "72.00", "14,564"]


def _bad_input_cases(tmp: Path) -> list[tuple[list[str], str]]:
    no_config = tmp / "empty"
    no_config.mkdir()
    broken = tmp / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "qwen3",')
    missing = tmp / "missing"
    missing.mkdir()
    (missing / "config.json").write_text(json.dumps({"model_type": "qwen3", "torch_dtype": "bfloat16"}))
    unknown = tmp / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    return [
        ([str(no_config)], "no config.json in this folder"),
        ([str(broken)], "malformed JSON"),
        ([str(missing)], "missing field 'num_hidden_layers'"),
        ([str(unknown)], "unknown architecture, field 'model_type' is 'bert'"),
        (["nobody/not-a-cached-model"], "nobody/not-a-cached-model: not a folder"),
        (["data/models/Qwen3-8B", "--kv-dtype", "int3"], "kv dtype 'int3': unknown"),
        (
            ["data/models/Qwen3-8B", "--max-model-len", "0"],
            "--max-model-len: expected an integer from 1 to 10,000,000, got '0'",
        ),
    ]


def test_bad_input_one_line_no_traceback(tmp_path: Path) -> None:
    for args, message in _bad_input_cases(tmp_path):
        out = run(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, (args, out.stderr)
        assert lines[0].startswith("kvstudy: error: ") and message in lines[0], (args, lines[0])
        assert "Traceback" not in out.stderr


@pytest.mark.parametrize("path", ["broken", "missing"])
def test_error_names_the_file(tmp_path: Path, path: str) -> None:
    cases = dict((Path(a[0]).name, m) for a, m in _bad_input_cases(tmp_path))
    assert path in cases
    out = run(str(tmp_path / path))
    assert str(tmp_path / path / "config.json") in out.stderr


def test_gpu_from_the_catalog_tp_and_csv(tmp_path: Path) -> None:
    csv = tmp_path / "figs" / "capacity.csv"
    out = run(
        "data/models/Qwen3-8B",
        "--kv-dtype",
        "bfloat16",
        "fp8",
        "--max-model-len",
        "4096",
        "--gpu",
        "L4",
        "--tensor-parallel-size",
        "2",
        "--csv",
        str(csv),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["tensor_parallel_size"] == 2
    assert data["weights_bytes"] == 16381470720 and data["weights_source"] == "safetensors index total_size"
    # 8 KV heads over 2 GPUs: 4 per GPU, 36 layers x 4 x 256 x 2 bytes
    assert data["dtypes"]["bfloat16"]["bytes_per_token_per_gpu"] == 36 * 4 * 256 * 2
    gpu = data["gpu"]
    assert gpu["gpu_name"] == "L4" and gpu["memory_source"].startswith("from the GPU catalog")
    assert gpu["utilization"] == 0.92 and "default" in gpu["utilization_source"]
    pool = int(int(23034 * 2**20) * 0.92) - 16381470720 // 2
    assert gpu["kv_pool_bytes"] == pool
    assert data["dtypes"]["fp8"]["users"] == pool // (36 * 4 * 256 * 4096)
    assert csv.read_text().splitlines()[0].startswith("kv dtype,")


def test_given_figures_override_and_a_model_that_does_not_fit() -> None:
    out = run(
        "data/models/Qwen3-8B",
        "--gpu",
        "L4",
        "--gpu-memory-gib",
        "8",
        "--gpu-memory-utilization",
        "0.5",
        "--weights-gib",
        "15.26",
    )
    assert out.returncode == 0, out.stderr
    assert "8.00 GiB (given) x utilization 0.5 (given)" in out.stdout
    assert "the weights (15.26 GiB) exceed the memory vLLM may use (4.00 GiB)" in out.stdout


def test_unknown_family_and_assume(tmp_path: Path) -> None:
    cfg = json.loads((ROOT / "data/models/Llama-3.1-8B/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "brand_new"}))
    refused = run(str(tmp_path), "--max-model-len", "100")
    assert refused.returncode == 2 and "--assume FAMILY" in refused.stderr
    assumed = run(str(tmp_path), "--max-model-len", "100", "--assume", "llama")
    assert assumed.returncode == 0 and "WARNING: model_type 'brand_new'" in assumed.stdout
    out = run("data/models/Mistral-7B-v0.1", "--max-model-len", "8192")
    assert out.returncode == 0, out.stderr
    assert "stops growing at 4,096 tokens" in out.stdout
    bad = run("data/models/Qwen3-8B", "--gpu", "Z9000")
    assert bad.returncode == 2 and "not in the GPU catalog" in bad.stderr


def test_a_gpu_with_cuda_total_in_the_catalog_starts_from_it() -> None:
    """vLLM multiplies CUDA's total (not the driver's) by the utilization: the H200's, measured by
    this project, is 615 MiB below what nvidia-smi shows."""
    from kvstudy.model.plan import resolve_gpu_memory

    h200 = resolve_gpu_memory("H200")
    assert h200.memory_gib * 2**30 == 150109880320 and "CUDA's total" in h200.memory_source
    l4 = resolve_gpu_memory("L4")  # no CUDA figure: the driver's, said so
    assert l4.memory_gib == 23034 / 1024 and "not in the catalog" in l4.memory_source
    measured = json.loads((ROOT / "data/gpus/measured/h200-gpu-check.json").read_text())
    assert measured["source"] == "captured by this project"
    assert measured["memory"]["cuda_total_bytes"] == 150109880320
    assert measured["memory"]["nvml_total_mib"] == 143771
