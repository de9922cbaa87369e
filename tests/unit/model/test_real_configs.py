"""Issue 30: real Hub configs read as vLLM reads them (validate what is read, where it is read), FP8
chosen by the checkpoint, the sparse-MLA and Qwen2.5-VL rules, and the hostile cases' bounds.

The fixtures are under tests/fixtures/models (see SOURCE.md there for where each comes from); the two
nemotron-nas configs are the Hub files as NVIDIA's NeMo repository copies them verbatim."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvstudy import cli
from kvstudy.errors import StudyError
from kvstudy.model.capacity import kv_footprint
from kvstudy.model.config_fields import checkpoint_kv_dtype
from kvstudy.model.layout import INDEXER, MLA, layout_from_config, load_layout
from kvstudy.model.plan import plan_summary
from kvstudy.model.weights import parameter_parts, weights_size

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
MODELS = ROOT / "data" / "models"


@pytest.fixture(autouse=True)
def _rules_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTUDY_NO_VLLM", "1")


def _parameters(folder: Path) -> int:
    """The parameters the weights estimate counts from a folder's config.json."""
    return sum(parameter_parts(json.loads((folder / "config.json").read_text())).values())


def _capacity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["capacity", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _folder(tmp_path: Path, config: dict[str, Any], name: str = "m") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# --------------------------------------------------------------------------- fields no figure reads


def test_nemotron_nas_hub_configs_read_with_their_nulls() -> None:
    """The Hub files hold "intermediate_size": null, "num_key_value_heads": null and blocks whose
    attention is a no-op with "n_heads_in_group": null; vLLM's nemotron_nas.py reads per block."""
    super49 = load_layout(FIXTURES / "Llama-3_3-Nemotron-Super-49B-v1")
    assert len(super49.layers) == 49 and super49.num_hidden_layers == 80
    assert kv_footprint(super49, "auto", 4096).bytes_per_token == 49 * 8 * 128 * 2 * 2  # 200,704
    ultra = load_layout(FIXTURES / "Llama-3_1-Nemotron-Ultra-253B-v1")
    assert kv_footprint(ultra, "fp8", 4096).bytes_per_token == len(ultra.layers) * 8 * 128 * 2
    # weights from each block's ffn_mult (nemotron_nas.py _ffn_mult_to_intermediate_size), no-op FFNs left out
    assert weights_size(FIXTURES / "Llama-3_3-Nemotron-Super-49B-v1").source.startswith("estimated from config")
    assert 49.0e9 < _parameters(FIXTURES / "Llama-3_3-Nemotron-Super-49B-v1") < 50.5e9
    assert 250e9 < _parameters(FIXTURES / "Llama-3_1-Nemotron-Ultra-253B-v1") < 256e9


@pytest.mark.parametrize(
    "folder", ["NVIDIA-Nemotron-Nano-9B-v2", "NVIDIA-Nemotron-3-Super-120B-A12B", "Llama-3_3-Nemotron-Super-49B-v1"]
)
def test_real_configs_exit_zero(capsys: pytest.CaptureFixture[str], folder: str) -> None:
    assert (
        "Infinity" in (FIXTURES / folder / "config.json").read_text()
        or "null" in (FIXTURES / folder / "config.json").read_text()
    )
    code, out, err = _capacity(capsys, str(FIXTURES / folder), "--gpu", "H100-SXM")
    assert code == 0 and "kv dtype" in out, err


def test_layers_block_type_list_reads_as_the_pattern() -> None:
    """transformers 5 writes Nemotron-H as a layers_block_type list (num_hidden_layers derived from it,
    time_step_limit as {"__float__": "Infinity"}): the same layout as the hybrid_override_pattern."""
    new = load_layout(FIXTURES / "NVIDIA-Nemotron-Nano-9B-v2-transformers5")
    old = load_layout(FIXTURES / "NVIDIA-Nemotron-Nano-9B-v2")
    assert "num_hidden_layers" not in json.loads((FIXTURES / new.name / "config.json").read_text())
    assert new.layers == old.layers and new.num_hidden_layers == old.num_hidden_layers == 56
    assert kv_footprint(new, "auto", 8192) == kv_footprint(old, "auto", 8192)


def test_unread_fields_of_any_form_are_accepted_read_ones_are_checked(tmp_path: Path) -> None:
    config = json.loads((MODELS / "Qwen3-8B" / "config.json").read_text())
    odd = {"time_step_limit": [0.0, 1e308], "rope_scaling": None, "x": {"__float__": "Infinity"}, "y": 10**400}
    folder = _folder(tmp_path, config | odd)
    base = kv_footprint(MODELS / "Qwen3-8B", "auto", 4096)
    assert kv_footprint(folder, "auto", 4096).bytes_per_token == base.bytes_per_token
    for field, value, said in [
        ("head_dim", 1e308, "'head_dim' is a number"),
        (
            "num_key_value_heads",
            10**400,
            "is 1000000000000000000000000000000000000... (expected at most 9,007,199,254,740,992)",
        ),
        ("num_hidden_layers", 10**9, "'num_hidden_layers' is 1000000000 (expected at most 10,000)"),
        ("num_attention_heads", None, "missing field 'num_attention_heads'"),
    ]:
        with pytest.raises(StudyError) as info:
            layout_from_config(config | {field: value}, "m/config.json")
        assert said in str(info.value) and "\n" not in str(info.value), str(info.value)


# --------------------------------------------------------------------------- FP8 chosen by the checkpoint


def test_modelopt_sidecar_makes_auto_fp8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-70B-Instruct-FP8's layout (Llama-3.3-70B's config.json, the same KV shape) with ModelOpt's
    hf_quant_config.json: vLLM's auto stores fp8_e4m3, 163,840 B/token, not 327,680."""
    folder = tmp_path / "Llama-3.1-70B-Instruct-FP8"
    folder.mkdir()
    shutil.copy(MODELS / "Llama-3.3-70B-Instruct" / "config.json", folder)
    shutil.copy(FIXTURES / "Llama-3.1-8B-Instruct-FP8-ModelOpt" / "hf_quant_config.json", folder)
    summary = plan_summary(str(folder), kv_dtype=["auto"], max_model_len=4096)
    assert summary["dtypes"]["auto"]["bytes_per_token"] == 163_840
    assert summary["dtypes"]["auto"]["resolved_dtype"] == "fp8_e4m3"
    assert summary["auto_kv_dtype"]["chosen_by"] == "hf_quant_config.json quantization.kv_cache_quant_algo 'FP8'"
    code, out, _ = _capacity(capsys, str(folder), "--max-model-len", "4096")
    assert code == 0 and "--kv-cache-dtype auto stores fp8_e4m3 here, not bfloat16" in out
    assert "hf_quant_config.json" in out and "resolve_kv_cache_dtype_string" in out
    auto_row = next(line for line in out.splitlines() if line.startswith("auto "))
    assert "163,840" in auto_row
    # without the sidecar, auto is the model's 16 bits again
    (folder / "hf_quant_config.json").unlink()
    assert kv_footprint(folder, "auto", 4096).bytes_per_token == 327_680


@pytest.mark.parametrize(
    "quant, expected",
    [
        (
            {
                "quant_method": "compressed-tensors",
                "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
            },
            ("fp8", "config.json quantization_config.kv_cache_scheme (compressed-tensors)"),
        ),
        (
            {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
            ("fp8_e4m3", "config.json quantization_config kv_cache_quant_algo 'FP8'"),
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, ("nvfp4", None)),
        ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None}, (None, None)),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, (None, None)),
        ({"quant_method": "compressed-tensors"}, (None, None)),
    ],
)
def test_checkpoint_kv_dtype_follows_vllm(quant: dict[str, Any], expected: tuple[str | None, str | None]) -> None:
    dtype, source = checkpoint_kv_dtype({"quantization_config": quant})
    assert dtype == expected[0]
    if expected[1]:
        assert source == expected[1]


def test_scales_names_the_sidecar_trap() -> None:
    from kvstudy.model.scales import dump_kv_settings, inspect_model

    report = inspect_model(FIXTURES / "Llama-3.1-8B-Instruct-FP8-ModelOpt")
    assert any("config.json trap in its ModelOpt form" in v for v in report.verdicts), report.verdicts
    rows = [r for r in dump_kv_settings(FIXTURES) if "ModelOpt" in r["config"]]
    assert rows[0]["auto_stores"] == "fp8_e4m3" and rows[0]["auto_chosen_by"].startswith("hf_quant_config.json")


# --------------------------------------------------------------------------- architectures


def test_sparse_mla_counts_the_indexer_and_fp8_ds_mla() -> None:
    """DeepSeek-V3.2: 61 MLA latents of 576 values and 61 indexer key vectors of 128 + 4 bytes."""
    layout = load_layout(FIXTURES / "DeepSeek-V3.2")
    assert layout.count(MLA) == layout.count(INDEXER) == 61
    assert kv_footprint(layout, "auto", 4096).bytes_per_token == 61 * (576 * 2 + 132)
    fp8 = kv_footprint(layout, "fp8", 4096, tensor_parallel_size=8)
    assert fp8.resolved_dtype == "fp8_ds_mla" and fp8.bytes_per_token == 61 * (656 + 132)
    assert fp8.bytes_per_token_per_gpu == fp8.bytes_per_token  # latent and indexer whole on every GPU
    glm = load_layout(FIXTURES / "GLM-5")
    assert glm.count(INDEXER) == glm.count(MLA) and "glm_moe_dsa" == glm.model_type


def test_indexer_frequency_skips_layers() -> None:
    """GLM-5.2's index_topk_freq: only every freq-th layer from index_skip_topk_offset keeps an indexer
    (vLLM deepseek_v2.py: max(i - offset + 1, 0) % freq == 0)."""
    config = json.loads((FIXTURES / "GLM-5" / "config.json").read_text())
    layout = layout_from_config(config | {"index_topk_freq": 4, "index_skip_topk_offset": 3}, "config.json")
    kept = [l.index for l in layout.layers if l.kind == INDEXER]
    n = layout.count(MLA)
    assert kept == [i for i in range(n) if max(i - 3 + 1, 0) % 4 == 0] and 0 < len(kept) < n
    pattern = "F" + "S" * (n - 1)
    layout = layout_from_config(config | {"index_topk_pattern": pattern}, "config.json")
    assert [l.index for l in layout.layers if l.kind == INDEXER] == [0]


def test_qwen2_5_vl_is_plain_gqa() -> None:
    layout = load_layout(FIXTURES / "Qwen2.5-VL-7B-Instruct")
    assert layout.layer_kinds == {"full_attention": 28}
    assert kv_footprint(layout, "auto", 4096).bytes_per_token == 28 * 4 * 128 * 2 * 2


def test_unknown_family_refused_in_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _capacity(capsys, str(FIXTURES / "DeepSeek-V4-Flash"), "--max-model-len", "4096")
    assert code == 2 and "'deepseek_v4'" in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------- hostile cases (item 8)


def test_scales_refuses_a_list_dtype_and_huge_layer_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i, (config, said) in enumerate(
        [
            ({"num_hidden_layers": 2, "torch_dtype": ["bfloat16"]}, "field 'torch_dtype' is a list"),
            ({"num_hidden_layers": 10**12}, "'num_hidden_layers' is 1000000000000 (expected at most 10,000)"),
            ({"num_hidden_layers": 2, "kv_cache_dtype": {"a": 1}}, "field 'kv_cache_dtype' is a"),
        ]
    ):
        folder = _folder(tmp_path, config, f"m{i}")
        assert cli.main(["scales", str(folder)]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_scales_on_a_5000_digit_layer_number_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import struct

    folder = _folder(tmp_path, {"num_hidden_layers": 2})
    name = "model.layers." + "9" * 5000 + ".self_attn.k_scale"
    header = json.dumps({name: {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 0.5))
    cli.main(["scales", str(folder)])
    err = capsys.readouterr().err
    assert "a layer number of 5,000 digits" in err and len(err.strip().splitlines()) == 1, err


def test_capacity_with_a_billion_layers_refuses_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstudy.limits import MAX_LAYERS
    from kvstudy.model import layout

    def layer_kinds(cfg: dict[str, Any], family: str, num_layers: int, where: str) -> list[list[str]]:
        assert num_layers <= MAX_LAYERS, f"per-layer work began for {num_layers:,} layers before the refusal"
        return real_layer_kinds(cfg, family, num_layers, where)

    real_layer_kinds = layout.layer_kinds
    monkeypatch.setattr(layout, "layer_kinds", layer_kinds)
    config = json.loads((MODELS / "Qwen3-8B" / "config.json").read_text()) | {"num_hidden_layers": 10**9}
    code, _, err = _capacity(capsys, str(_folder(tmp_path, config)))
    assert code == 2 and "expected at most 10,000" in err and len(err.strip().splitlines()) == 1
