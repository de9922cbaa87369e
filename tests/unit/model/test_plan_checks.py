"""Only valid plans (TP sizes vLLM accepts, contexts within the config), weights that never hide the
KV table, and weight estimates that read relu2 MLPs, latent MoE and nested / sidecar quantization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.cli import main
from kvstudy.errors import StudyError
from kvstudy.model import plan
from kvstudy.model.layout import layout_from_config
from kvstudy.model.weights import estimate_weights, parameter_parts, quantization_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "models"


def _summary(path: Path, **kw: object) -> dict:
    return plan.plan_summary(str(path), **{"max_model_len": 4096, **kw})  # type: ignore[arg-type]


def _config(tmp_path: Path, **changes: object) -> Path:
    config = json.loads((FIXTURES / "Mixtral-8x7B-Instruct-v0.1" / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_tp_size_vllm_refuses_is_refused(tmp_path: Path) -> None:
    folder = _config(tmp_path, num_attention_heads=28, num_key_value_heads=4, head_dim=128)
    with pytest.raises(StudyError, match="28 attention heads are not divisible by 8"):
        _summary(folder, tensor_parallel_size=8)
    summary = _summary(folder, tensor_parallel_size=4)
    assert summary["source"] == "kvstudy rules" and "8" in summary["tensor_parallel_refused"]


def test_context_beyond_the_config_needs_asking(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    with pytest.raises(StudyError, match="max_position_embeddings 32,768"):
        _summary(folder, max_model_len=65536)
    assert _summary(folder, max_model_len=65536, allow_long_context=True)["context_len"] == 65536


def test_failed_weight_estimate_keeps_the_kv_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _config(tmp_path, quantization_config={"quant_method": "hqq"})
    summary = _summary(folder, gpu="H100-SXM")
    assert summary["weights_bytes"] is None and "hqq" in summary["weights_source"]
    assert summary["dtypes"]["fp8"]["bytes_per_token"] == 65536
    assert main(["capacity", str(folder), "--max-model-len", "4096", "--gpu", "H100-SXM"]) == 0
    assert "weights unknown" in capsys.readouterr().out


def test_relu2_mlp_is_two_matrices_and_latent_moe_is_counted() -> None:
    nano = json.loads((FIXTURES / "NVIDIA-Nemotron-Nano-9B-v2" / "config.json").read_text())
    parts = parameter_parts(nano)
    mlp_layers = nano["hybrid_override_pattern"].count("-")
    assert parts["mlp"] == 2 * 4480 * 15680 * mlp_layers
    sup = json.loads((FIXTURES / "NVIDIA-Nemotron-3-Super-120B-A12B" / "config.json").read_text())
    moe_layers = sup["hybrid_override_pattern"].count("E")
    assert parameter_parts(sup)["experts"] == 2 * 1024 * 2688 * 512 * moe_layers


def test_nested_and_sidecar_quantization() -> None:
    kimi = json.loads((FIXTURES / "Kimi-K2.5" / "config.json").read_text())
    quant = quantization_config(kimi)
    assert quant is not None and quant["quant_method"] == "compressed-tensors"
    assert "compressed-tensors 4-bit" in estimate_weights(kimi).source
    folder = FIXTURES / "Llama-3.1-8B-Instruct-FP8-ModelOpt"
    config = json.loads((folder / "config.json").read_text())
    size = estimate_weights(config, str(folder / "config.json"))
    assert "FP8" in size.source and "ModelOpt" in size.source
    layout = layout_from_config(config, str(folder / "config.json"))
    assert size.bytes < estimate_weights(config, "elsewhere/config.json", layout).bytes


def test_gpu_table_keeps_only_valid_tp(tmp_path: Path) -> None:
    folder = _config(tmp_path, num_attention_heads=28, num_key_value_heads=4, head_dim=128)
    layout = plan.resolve_layout(folder)
    table = plan.gpu_tp_table(layout, ["fp8"], ["H100-SXM"], [1, 2, 4, 8], 4096, 10 * 2**30)
    assert sorted({tp for _, tp in table.index}) == [1, 2, 4]
