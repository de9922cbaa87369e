"""The positive-control checkpoint: K times the factor, Q divided by it, scales that bound K."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvstudy.precision import simulate
from kvstudy.tools import checkpoints as ctl

SOURCE = Path(__file__).resolve().parents[3] / "data" / "trained-model" / "qwen3-mini"


def test_control_scales_norms_and_writes_scales(tmp_path: Path) -> None:
    record = ctl.build_control(SOURCE, tmp_path / "c")
    old = ctl.read_bf16_safetensors(SOURCE / ctl.WEIGHTS)
    new = ctl.read_bf16_safetensors(tmp_path / "c" / ctl.WEIGHTS)
    k = "model.layers.0.self_attn.k_norm.weight"
    q = "model.layers.0.self_attn.q_norm.weight"
    assert np.array_equal(new[k][1], old[k][1] * 2048) and np.array_equal(new[q][1], old[q][1] / 2048)
    other = "model.layers.0.self_attn.k_proj.weight"
    assert np.array_equal(new[other][1], old[other][1])
    k_scales, v_scales, found = simulate.checkpoint_scales(str(tmp_path / "c"), 4)
    assert k_scales is not None and np.allclose(k_scales, record["k_scales"], rtol=1e-6)
    assert min(k_scales) * 448 > 2048  # K is far outside FP8's range at scale 1.0
    assert v_scales == (1.0, 1.0, 1.0, 1.0) and "k_scale" in found
    again = ctl.build_control(SOURCE, tmp_path / "d")
    assert again["weights_sha256"] == record["weights_sha256"]  # deterministic


def test_a_ladder_grade_without_scales_is_served_at_scale_one(tmp_path: Path) -> None:
    record = ctl.build_control(SOURCE, tmp_path / "g8", factor=8.0, scales=False)
    new = ctl.read_bf16_safetensors(tmp_path / "g8" / ctl.WEIGHTS)
    assert not any(name.endswith(("k_scale", "v_scale")) for name in new)
    assert record["k_scales"] is None and "no KV scales" in record["what"]
    k_scales, v_scales, _ = simulate.checkpoint_scales(str(tmp_path / "g8"), 4)
    assert k_scales is None and v_scales is None  # vLLM then uses 1.0
