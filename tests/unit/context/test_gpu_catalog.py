"""The GPU catalog: lookups by name and alias, units, and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.gpu_catalog import DEFAULT_CATALOG, find_gpu, load_catalog, normalize_name

REQUIRED = (
    "L4",
    "A10G",
    "L40S",
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "B200",
    "RTX-4090",
    "MI300X",
)


def test_every_required_gpu_is_there_with_positive_figures() -> None:
    catalog = load_catalog()
    for name in REQUIRED:
        spec = catalog[name]
        assert spec.memory_gib > 0 and spec.bandwidth_gb_s > 0
        assert spec.source and spec.fp8_kv_note
        # driver MiB -> GiB, never the marketing GB converted
        assert spec.memory_gib == spec.memory_mib_driver / 1024


def test_l4_is_the_study_figure() -> None:
    l4 = find_gpu("L4")
    assert l4.memory_mib_driver == 23034
    assert round(l4.memory_gib, 2) == 22.49  # what profiles/reference.yaml uses
    assert l4.bandwidth_gb_s == 300
    assert l4.fp8_hardware and not l4.fp4_hardware


@pytest.mark.parametrize(
    "alias, name",
    [
        ("h100", "H100-SXM"),
        ("H100 SXM5 80GB", "H100-SXM"),
        ("h100_sxm", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("a100-sxm4-40gb", "A100-40GB"),
        ("rtx 4090", "RTX-4090"),
        ("AMD Instinct MI300X", "MI300X"),
        ("b200", "B200"),
        ("  l40s ", "L40S"),
    ],
)
def test_aliases_and_case(alias: str, name: str) -> None:
    assert find_gpu(alias).name == name


def test_fp8_and_fp4_support() -> None:
    assert not find_gpu("A10G").fp8_hardware and not find_gpu("A100-80GB").fp8_hardware
    assert find_gpu("H200").fp8_hardware and find_gpu("MI300X").fp8_hardware
    assert [n for n in REQUIRED if find_gpu(n).fp4_hardware] == ["B200"]


def test_unknown_gpu_lists_the_known_names() -> None:
    with pytest.raises(StudyError) as err:
        find_gpu("V100")
    message = str(err.value)
    assert "V100" in message and "known:" in message
    for name in REQUIRED:
        assert name in message


def test_names_and_aliases_are_unique() -> None:
    owner: dict[str, str] = {}
    for spec in load_catalog().values():
        for key in (spec.name, *spec.aliases):
            assert owner.setdefault(normalize_name(key), spec.name) == spec.name
    assert list(load_catalog())[:1] == ["L4"]


def test_bad_catalog_files(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(StudyError, match="not found"):
        load_catalog(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(StudyError, match="malformed JSON at line 1"):
        load_catalog(broken)
    entry = json.loads(DEFAULT_CATALOG.read_text())["gpus"][0]
    entry["bandwidth_gb_s"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": [entry]}), encoding="utf-8")
    with pytest.raises(StudyError, match="bandwidth_gb_s"):
        load_catalog(bad)
