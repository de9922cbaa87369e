"""Issue 25: a profile's counts and sizes are checked against named bounds, and its numbers for
finiteness, when the profile is checked (before any notebook runs); one line naming the bound.
Each case was accepted before."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from kvstudy import profiles
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "notebook, line, words",
    [
        (
            "01_capacity-math",
            "context_len: 99999999999999",
            "'context_len': expected less than or equal to 10000000, got 99999999999999",
        ),
        ("01_capacity-math", "context_len: -5", "'context_len': expected greater than or equal to 1, got -5"),
        ("01_capacity-math", "tensor_parallel_size: 0", "expected greater than or equal to 1, got 0"),
        (
            "01_capacity-math",
            "contexts: [1024, 99999999999]",
            "expected less than or equal to 10000000, got 99999999999",
        ),
        ("01_capacity-math", "contexts: [" + ", ".join(["1"] * 20000) + "]", "20,000 items, expected at most 10,000"),
        ("01_capacity-math", "overhead_gib: .nan", "is nan, expected a finite number"),
        ("01_capacity-math", "overhead_gib: .inf", "is inf, expected a finite number"),
        (
            "05_context-scaling",
            "lengths: [256, 100000000]",
            "05_context-scaling: lengths[1]: expected less than or equal to 10000000, got 100000000",
        ),
        ("05_context-scaling", "prompts: 0", "05_context-scaling: prompts: expected greater than or equal to 1"),
        ("05_context-scaling", "output_len: 2", "05_context-scaling: output_len: expected greater than or equal to 3"),
        ("02_speed-sweep", "prompts_per_user: 0", "02_speed-sweep: prompts_per_user: expected greater than or equal"),
        ("02_speed-sweep", "ready_timeout_s: 0", "02_speed-sweep: ready_timeout_s: expected greater than 0"),
        ("08_load-at-equal-memory", "target_share: 2.0", "target_share: expected less than or equal to 1"),
        ("05_context-scaling", "n_boot: 10000000000", "expected less than or equal to 1000000"),
        ("07_kv-precision", "threads: 0", "expected greater than or equal to 1, got 0"),
        ("07_kv-precision", "gsm8k_n: 100000000", "expected less than or equal to 1000000"),
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


def test_one_bound_per_name() -> None:
    """A parameter named as a spec field has that field's bound wherever it appears (03's and 06's
    cpu_kvcache_space_gib and max_model_len are bounded as the sweeps' are)."""
    shared = 0
    for spec in profiles.SPECS.values():
        for name, field in spec.model_fields.items():
            if name in profiles.PARAMETER_BOUNDS:
                shared += 1
                bound = TypeAdapter(profiles.PARAMETER_BOUNDS[name]).json_schema()
                assert TypeAdapter(field.annotation).json_schema()["anyOf"][0] == bound, name
    assert shared >= 2
