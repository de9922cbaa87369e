"""The roofline model against hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.model.roofline import (
    DEFAULT_BANDWIDTH_FACTOR,
    kv_dominates_from,
    max_fp8_gain_pct,
    predicted_slope_ms_per_token,
    roofline,
    speedup_pct,
    step_bytes,
    tpot_ms,
    weights_read,
)
from kvstudy.model.weights import expert_routing, parameter_parts, weights_size

QWEN = "data/models/Qwen3-8B"
LLAMA = "data/models/Llama-3.1-8B"
GEMMA = "data/models/gemma-3-27b-it"
GPT_OSS = "data/models/gpt-oss-20b"
# Llama-4-Maverick: 128 experts in every second layer only (interleave_moe_layer_step 2); config only.
MAVERICK = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "Llama-4-Maverick-17B-128E"


def test_qwen3_8b_on_l4_one_user_1100_tokens() -> None:
    """Hand computation (the study's case, ~1.1k tokens on an L4).

    KV: 36 layers x 8 KV heads x (128 + 128) values x 2 B = 147,456 B/token (BF16), 73,728 (FP8);
        x 1,100 tokens = 162,201,600 B and 81,100,800 B.
    Weights: 16,381,470,720 B (the bundled index) less the untied input embedding
        151,936 x 4,096 x ~2 B = ~1.245e9 B -> ~15.137e9 B read per step.
    Activations: 36 x 2 x 2 B x (8 x 4,096 + 3 x 12,288) + 151,936 x 4 B = 10,634,752 B.
    Step: 15.137e9 + 0.1622e9 + 0.0106e9 = 15.310e9 B (BF16) vs 15.229e9 B (FP8):
        speedup 15.310 / 15.229 - 1 = 0.53 %. (Counting the whole 16.38e9 B of weights gives 0.49 %.)
    """
    result = roofline(QWEN, 1100, 1, gpu="L4")
    bf16, fp8 = result.steps["bfloat16"], result.steps["fp8"]
    assert bf16.kv_bytes == 162_201_600 and fp8.kv_bytes == 81_100_800
    assert bf16.activation_bytes == 10_634_752
    assert bf16.weights_bytes == pytest.approx(16_381_470_720 - 151_936 * 4096 * 2, rel=2e-3)
    assert result.fp8_speedup_pct == pytest.approx(0.53, abs=0.02)  # "about 0.5 %"
    assert bf16.kv_share == pytest.approx(0.0106, abs=0.0005)
    # TPOT = bytes / (300 GB/s x 0.9)
    assert result.predicted_tpot_ms["bfloat16"] == pytest.approx(bf16.total_bytes / (300e9 * 0.9) * 1e3)
    assert result.kv_dominates_from_tokens["bfloat16"] is None  # not within 40,960 tokens
    with_all_weights = roofline(QWEN, 1100, 1, gpu="L4")
    assert with_all_weights.weights.total_bytes == 16_381_470_720


def test_llama_3_1_8b_on_h100_32k() -> None:
    """Hand computation.

    KV: 32 x 8 x 256 x 2 B = 131,072 B/token; x 32,768 = 4,294,967,296 B (BF16), half in FP8.
    Weights (estimated from config, BF16): 2 x 128,256 x 4,096 + 32 x (2 x 4,096^2 + 2 x 4,096 x 1,024
        + 3 x 4,096 x 14,336) = 8,029,995,008 parameters x 2 B = 16,059,990,016 B; less the untied
        embedding 128,256 x 4,096 x 2 B = 1,050,673,152 B -> 15,009,316,864 B read.
    Activations: 32 x 4 x (8 x 4,096 + 3 x 14,336) + 128,256 x 4 = 10,212,352 B.
    Step: 19,314,496,512 B vs 17,167,012,864 B -> speedup 12.51 %; TPOT 19.3145e9 / 3,015e9 = 6.406 ms.
    """
    result = roofline(LLAMA, 32768, 1, gpu="H100-SXM")
    bf16, fp8 = result.steps["bfloat16"], result.steps["fp8"]
    assert result.weights.total_bytes == 16_059_990_016
    assert bf16.weights_bytes == pytest.approx(15_009_316_864)
    assert bf16.kv_bytes == 4_294_967_296 and fp8.kv_bytes == 2_147_483_648
    assert bf16.total_bytes == pytest.approx(19_314_496_512)
    assert fp8.total_bytes == pytest.approx(17_167_012_864)
    assert result.fp8_speedup_pct == pytest.approx(12.51, abs=0.01)  # "about 12 %"
    assert result.predicted_tpot_ms["bfloat16"] == pytest.approx(6.406, abs=0.001)
    # KV reaches the weights read at 15,009,316,864 / 131,072 = 114,512 tokens (BF16)
    assert result.kv_dominates_from_tokens == {"bfloat16": 114_512, "fp8": None}
    # predicted slope 131,072 B / 3,015 GB/s = 4.35e-05 ms/token (published: 4.37e-05)
    assert result.predicted_itl_slope_ms_per_token["bfloat16"] == pytest.approx(4.347e-05, rel=1e-3)


def test_sliding_window_caps_growth_gemma3() -> None:
    """gemma-3-27b: 62 layers, every 6th global: 10 full + 52 sliding (window 1,024), 16 KV heads x 128.

    Per layer 16 x 256 x 2 B = 8,192 B/token. At 32,768 tokens a request reads
    10 x 8,192 x 32,768 + 52 x 8,192 x 1,024 = 2,684,354,560 + 436,207,616 = 3,120,562,176 B;
    doubling the context adds only the full layers' 10 x 8,192 x 32,768 B.
    """
    at_32k = step_bytes(GEMMA, "bfloat16", 32768).kv_bytes
    at_64k = step_bytes(GEMMA, "bfloat16", 65536).kv_bytes
    assert at_32k == 3_120_562_176 == 10 * 8192 * 32768 + 52 * 8192 * 1024
    assert at_64k - at_32k == 10 * 8192 * 32768
    # short contexts: every layer grows until the window fills
    assert step_bytes(GEMMA, "bfloat16", 512).kv_bytes == 62 * 8192 * 512


def test_gpt_oss_skip_sliding_predicts_half_the_slope() -> None:
    """gpt-oss-20b: 12 full + 12 sliding (window 128), 8 KV heads x 64: 2,048 B/token/layer in BF16.

    Past the window only the 12 full layers grow: 24,576 B/token BF16, 12,288 FP8; keeping the
    sliding layers in BF16 does not change that, so the predicted slope ratio is 50 % (the text
    measured 71 %).
    """
    bf16 = predicted_slope_ms_per_token(GPT_OSS, "bfloat16", 3350, 0.9)
    fp8 = predicted_slope_ms_per_token(GPT_OSS, "fp8", 3350, 0.9, skip_layers="sliding_window")
    assert fp8 / bf16 == pytest.approx(0.5)
    assert bf16 == pytest.approx(24_576 / (3350e9 * 0.9) * 1e3)
    kv = step_bytes(GPT_OSS, "fp8", 20000, skip_layers="sliding_window").kv_bytes
    assert kv == 12 * 1024 * 20000 + 12 * 2048 * 128  # the sliding layers kept in BF16, capped


def test_moe_weights_read_grow_with_users() -> None:
    one = weights_read(GPT_OSS, 1)
    many = weights_read(GPT_OSS, 64)
    assert one.expert_bytes_skipped > many.expert_bytes_skipped > 0
    assert one.read_bytes < many.read_bytes < many.total_bytes
    assert any("uniform routing" in n for n in one.notes)


def test_interleaved_moe_counts_the_experts_as_the_weights_do() -> None:
    """Maverick has 128 experts of 3 x 5,120 x 8,192 parameters in the 24 odd-numbered layers of 48
    (``interleave_moe_layer_step`` 2): 386,547,056,640 expert parameters, as ``weights.parameter_parts``
    counts them. The roofline skips the experts no request routes to from that count (at one user and
    one expert per token, 127 of 128), not from all 48 layers (773e9 parameters, as it once did)."""
    parts = parameter_parts(json.loads((MAVERICK / "config.json").read_text()))
    assert parts["experts"] == 24 * 3 * 5120 * 8192 * 128 == 386_547_056_640
    size = weights_size(MAVERICK)
    parameters = sum(parts.values())
    per_param = size.bytes / parameters
    assert expert_routing(json.loads((MAVERICK / "config.json").read_text())) == (128, 1)
    assert per_param == pytest.approx(2.0)
    read = weights_read(MAVERICK, 1)
    assert read.expert_bytes_skipped == pytest.approx(parts["experts"] * per_param * 127 / 128)
    assert read.embedding_bytes_skipped == pytest.approx(parts["embedding"] * per_param)
    assert read.read_bytes == pytest.approx(size.bytes - read.expert_bytes_skipped - read.embedding_bytes_skipped)
    assert any("1 of 128 experts per token" in n for n in read.notes)
    # counted over all 48 layers the skipped experts (1.53e12 B) exceeded the whole checkpoint: a step read 0 B
    assert read.read_bytes / per_param == pytest.approx(parameters - parts["embedding"] - parts["experts"] * 127 / 128)
    assert roofline(MAVERICK, 8192, 1, gpu="H200").steps["bfloat16"].weights_bytes == pytest.approx(read.read_bytes)


def test_weights_override_and_bound_helpers() -> None:
    given = roofline(LLAMA, 32768, 1, gpu="h100", weights_bytes=10 * 2**30)
    assert given.weights.total_bytes == 10 * 2**30 and given.weights.total_source == "given"
    assert given.fp8_speedup_pct > 12.51
    assert max_fp8_gain_pct(LLAMA, 32768, 1) == pytest.approx(12.51, abs=0.01)
    assert speedup_pct(110.0, 100.0) == pytest.approx(10.0)
    assert tpot_ms(1e9, 1000, 1.0) == pytest.approx(1.0)


def test_assumptions_carry_their_origin() -> None:
    result = roofline(QWEN, 1100, 1, gpu="L4")
    origins = {a.name: a.origin for a in result.assumptions}
    assert origins["bandwidth_factor"] == "assumed" and result.bandwidth_factor == DEFAULT_BANDWIDTH_FACTOR
    assert origins["bandwidth_gb_s"] == "datasheet"
    measured = roofline(QWEN, 1100, 1, bandwidth_gb_s=12.5, bandwidth_origin="measured", bandwidth_factor=1.0)
    origins = {a.name: a.origin for a in measured.assumptions}
    assert origins["bandwidth_gb_s"] == "measured" and origins["bandwidth_factor"] == "given"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"context_len": 0}, "context 0"),
        ({"context_len": -5}, "context -5"),
        ({"context_len": 50000}, "max_position_embeddings 40,960"),
        ({"context_len": 1000, "users": 0}, "users 0"),
        ({"context_len": 1000, "bandwidth_factor": 1.5}, "bandwidth factor"),
        ({"context_len": 1000, "gpu": "V100"}, "known: L4"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    kwargs = {"gpu": "L4", **kwargs}
    with pytest.raises(StudyError, match=match):
        roofline(QWEN, **kwargs)


def test_kv_dominates_never_for_a_fully_windowed_cap() -> None:
    # gpt-oss at one user: full layers reach the (BF16-estimated) weights only past its 131,072 limit
    assert kv_dominates_from(GPT_OSS, "fp8", 1) is None
