"""The simulated KV storage: FP8 round trips, saturation, scales, int8, the registered attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvstudy.errors import StudyError  # noqa: E402
from kvstudy.precision import simulate  # noqa: E402


def stored(x: torch.Tensor, fmt: str, scale: float = 1.0) -> torch.Tensor:
    """``x`` kept as a K of layer 0 in ``fmt`` at ``scale`` and read back (``quantize.store``)."""
    return simulate.store(x, simulate.Storage("t", fmt, (scale,), (scale,)), "k", 0)


def test_fp8_round_trip_keeps_representable_values() -> None:
    values = torch.tensor([0.0, 1.0, -2.0, 0.5, 448.0, -448.0, 1.125, 0.015625])
    assert torch.equal(stored(values, "float8_e4m3fn", 1.0), values)


def test_fp8_round_trip_rounds_to_three_mantissa_bits() -> None:
    x = torch.linspace(-300, 300, 2001)
    y = stored(x, "float8_e4m3fn", 1.0)
    rel = ((y - x).abs() / x.abs().clamp(min=1.0)).max()
    assert 0 < rel <= 2**-4 + 1e-6  # half an ulp of a 3-bit mantissa


def test_fp8_saturates_instead_of_nan() -> None:
    x = torch.tensor([500.0, -1e6, 1e4])
    y = stored(x, "float8_e4m3fn", 1.0)
    assert torch.equal(y, torch.tensor([448.0, -448.0, 448.0]))
    z = stored(torch.tensor([1e9]), "float8_e5m2", 1.0)
    assert float(z) == 57344.0


def test_fp8_scale_moves_the_range() -> None:
    x = torch.tensor([1000.0, -2000.0, 3.0])
    y = stored(x, "float8_e4m3fn", 2000.0 / 448.0)
    assert abs(float(y[1]) + 2000.0) < 1e-3  # no saturation with the right scale
    assert abs(float(y[0]) - 1000.0) / 1000.0 <= 2**-4


def test_bf16_and_int8_round_trips() -> None:
    x = torch.randn(2, 2, 5, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(stored(x, "bfloat16"), x.to(torch.bfloat16).float())
    y = stored(x, "int8_per_token_head")
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((y - x).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(stored(torch.zeros(1, 1, 1, 4), "int8_per_token_head"), torch.zeros(1, 1, 1, 4))


def test_storage_checks_its_fields() -> None:
    s = simulate.Storage("a", "float8_e4m3fn", (0.5, 2.0), None)
    assert s.scale("k", 1) == 2.0 and s.scale("v", 1) == 1.0
    with pytest.raises(StudyError):
        s.scale("k", 2)
    with pytest.raises(StudyError):
        simulate.Storage("b", "float4")
    with pytest.raises(StudyError):
        simulate.Storage("c", "float8_e4m3fn", (0.0,))
    with pytest.raises(StudyError):
        simulate.Storage("d", "float8_e4m3fn", None, (-1.0,))


def test_calibrated_scales_are_amax_over_448() -> None:
    k, v = simulate.calibrated_scales({("k", 0): 448.0, ("v", 0): 44.8}, 1, "float8_e4m3fn")
    assert k == (1.0,) and abs(v[0] - 0.1) < 1e-12
    with pytest.raises(StudyError, match="layers"):
        simulate.calibrated_scales({("k", 0): 1.0, ("v", 0): 1.0}, 2, "float8_e4m3fn")


def test_matmul_attention_matches_sdpa() -> None:
    class Module:
        num_key_value_groups = 2
        training = False

    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 4, 7, 8, generator=g),
        torch.randn(1, 2, 7, 8, generator=g),
        torch.randn(1, 2, 7, 8, generator=g),
    )
    out, _ = simulate.matmul_attention(Module(), q, k, v, None, 8**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)
