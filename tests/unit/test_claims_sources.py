"""Claims about sources and profiles that the reports and data pages make."""

from __future__ import annotations

from pathlib import Path

from kvstudy.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_15_27_gib_is_not_attributed_to_the_published_study() -> None:
    seed = ROOT.parent / "shared" / "seeds" / "000_abadbf616243485f.txt"
    if seed.is_file():
        assert "15.27" not in seed.read_text()
    text = (ROOT / "data" / "models" / "SOURCE.md").read_text()
    assert 'The study\'s log says "Model loading\ntook 15.27 GiB" (seed 000)' not in text
    assert "illustrative" in text and "has no such line" in text


def test_l4_profile_flags_queueing_and_registers_its_design() -> None:
    text = (ROOT / "profiles" / "l4-qwen3-8b.yaml").read_text()
    assert "QUEUEING AT 32 USERS" in text and "20 of the 32" in text
    section = load_profile("l4-qwen3-8b", ROOT / "profiles")["notebooks"]["02_speed-sweep"]
    assert section["registered_runs_per_arm"] == len(section["seeds"]) == 10
    # the design can reach a claim: the best within-seed permutation p, Holm over the report's 8 tests
    assert 8 * 2 / 2 ** len(section["seeds"]) < 0.05 and len(section["seeds"]) % 2 == 0
