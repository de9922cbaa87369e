"""Issue 25: a profile's counts and sizes are checked against named bounds, and its numbers for
finiteness, when the profile is checked (before any notebook runs); one line naming the bound.
Each case was accepted before."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstudy import profiles
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "notebook, line, words",
    [
        ("01_capacity-math", "context_len: 99999999999999", "'context_len': 99999999999999 is outside 1 .. 10,000,000"),
        ("01_capacity-math", "context_len: -5", "-5 is outside 1 .. 10,000,000"),
        ("01_capacity-math", "tensor_parallel_size: 0", "0 is outside 1 .. 4,096"),
        ("01_capacity-math", "contexts: [1024, 99999999999]", "99999999999 is outside 1 .. 10,000,000"),
        ("01_capacity-math", "contexts: [" + ", ".join(["1"] * 20000) + "]", "20,000 items, expected at most 10,000"),
        ("01_capacity-math", "overhead_gib: .nan", "is nan, expected a finite number"),
        ("01_capacity-math", "overhead_gib: .inf", "is inf, expected a finite number"),
        ("05_context-scaling", "lengths: [256, 100000000]", "100000000 is outside 1 .. 10,000,000"),
        ("05_context-scaling", "n_boot: 10000000000", "outside 0 .. 1,000,000"),
        ("07_kv-precision", "threads: 0", "0 is outside 1 .. 4,096"),
        ("07_kv-precision", "gsm8k_n: 100000000", "outside 0 .. 1,000,000"),
    ],
)
def test_profile_counts_and_sizes_are_bounded(tmp_path: Path, notebook: str, line: str, words: str) -> None:
    (tmp_path / "p.yaml").write_text(f"description: x\nnotebooks:\n  {notebook}:\n    {line}\n")
    data = profiles.load_profile("p", tmp_path)
    with pytest.raises(StudyError, match=words.replace("[", r"\[").replace(".", r"\.")) as err:
        profiles.validate_profile(data, ROOT / "notebooks")
    assert "\n" not in str(err.value)


def test_the_bundled_profiles_are_within_the_bounds() -> None:
    for path in sorted((ROOT / "profiles").glob("*.yaml")):
        profiles.validate_profile(profiles.load_profile(path.stem, ROOT / "profiles"), ROOT / "notebooks")


def test_every_bounded_parameter_is_a_notebook_parameter() -> None:
    """A misspelt name in PARAMETER_BOUNDS would bound nothing."""
    declared = {k for nb in (ROOT / "notebooks").glob("*.ipynb") for k in profiles.declared_parameters(nb)}
    assert set(profiles.PARAMETER_BOUNDS) <= declared
