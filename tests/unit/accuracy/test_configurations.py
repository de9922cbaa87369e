"""The study's accuracy configurations: each changes only its intended server fields."""

from __future__ import annotations

from kvstudy.accuracy import configurations as cf
from kvstudy.vllm.command import ServerConfig


def test_server_config_changes_only_the_intended_fields():
    base = ServerConfig(model="m", cpu_kvcache_space_gib=1.0, max_model_len=4096, seed=0)
    for cfg in cf.CONFIGURATIONS.values():
        changed = {k for k, v in cf.server_config_for(cfg, base).to_dict().items() if v != base.to_dict()[k]}
        assert changed <= set(cfg.intended), (cfg.name, changed)
        assert changed == {k for k in cfg.intended if k in ("kv_cache_dtype", "quantization", "model")}
    weak = cf.server_config_for(cf.CONFIGURATIONS["random-weights"], base)
    assert weak.model == "data/tiny-models/tiny-qwen3" and weak.kv_cache_dtype == "auto"


def test_the_repeat_configuration_gets_its_own_server():
    groups = {c.server_key() for c in cf.configurations(["bf16", "bf16-zero-shot", "bf16-repeat"])}
    assert len(groups) == 2  # bf16 and its zero-shot share a server; the repeat starts a fresh one
    assert cf.CONFIGURATIONS["bf16-repeat"].intended == ()


def test_fp8_kv_backend_applies_only_to_fp8_kv_configurations() -> None:
    base = ServerConfig(model="m", env={"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    by_name = {
        c.name: cf.server_config_for(c, base, "TRITON_ATTN")
        for c in cf.configurations(["bf16", "fp8-weights", "fp8-kv", "fp8-weights-fp8-kv"])
    }
    assert by_name["bf16"].attention_backend is None
    assert by_name["fp8-weights"].attention_backend is None
    assert by_name["fp8-kv"].attention_backend == "TRITON_ATTN"
    assert by_name["fp8-weights-fp8-kv"].attention_backend == "TRITON_ATTN"
    assert all(cfg.env == base.env for cfg in by_name.values())
    assert cf.server_config_for(cf.CONFIGURATIONS["fp8-kv"], base).attention_backend is None
