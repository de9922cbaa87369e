"""The speed notebook on the reference profile: it renders and states what the bundled data says."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvstudy.profiles import declared_parameters, given_parameters, load_profile
from kvstudy.speed import analysis as speed

if TYPE_CHECKING:
    from conftest import Rendered  # tests/notebooks/conftest.py: the one render of the reference profile

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_speed-sweep.ipynb"


@pytest.mark.notebooks
def test_reference_render_recomputes_published_ratio_and_reads_capture(reference: Rendered) -> None:
    profile = load_profile("reference", ROOT / "profiles")
    params = given_parameters(
        profile, NOTEBOOK.stem, declared_parameters(ROOT / "notebooks" / f"{NOTEBOOK.stem}.ipynb")
    )
    assert params["run_missing"] is False  # the reference profile never starts vLLM
    run = reference.runs[NOTEBOOK.stem]
    assert run.error is None, run.error
    finding = reference.finding(NOTEBOOK.stem) or ""
    html_text = reference.html(NOTEBOOK.stem).read_text()
    # the published table under the new rule: 3 vs 2 seeds cannot reach p < 0.05 with an exact test
    assert (
        "L4 published, 1 user(s): FP8 faster by 2.2 % per token, no claim (the design cannot reach significance"
    ) in finding
    assert "no claim (no claim" not in finding  # the verdict is not repeated as its own reason
    # 32 users x 1,152 tokens against the 1,506-block pool, from Qwen3-8B's config.json and vLLM's block rules
    assert "2304" in html_text and "yes: 12 of 32 requests wait" in html_text
    assert "L4 published, 32 user(s): FP8 faster by 3.3 % per token, no claim" in finding
    assert "another factor changed" not in html_text and "more by 3.2 %" in html_text
    assert "26.6 streams" in html_text and "calibration not possible with this design" in html_text
    assert "at equal clock" not in html_text and "not varied / not measured" in html_text
    cap = speed.load_capture(ROOT / params["capture"])
    html = html_text.replace("<wbr/>", "")  # the renderer may break long words
    for cell in cap.spec.cells():  # every cell of the bundled capture is listed with its state
        assert cell.id in html
    # the bundled capture has per-request records and telemetry, and the views were drawn from them
    assert len(cap.requests) and len(cap.telemetry)
    for name in ("speed-distributions", "speed-clock", "speed-seed-ranges"):
        assert (reference.figures / f"{name}.png").is_file(), name


def test_sweep_parameters_are_sweepspec_fields_with_no_default_of_their_own() -> None:
    # One name and one default from profile to code: the notebook declares every SweepSpec field,
    # with None ("SweepSpec's default"), so the only defaults are the dataclass's.
    from kvstudy.profiles import declared_parameters
    from kvstudy.speed.spec import SweepSpec

    declared = declared_parameters(NOTEBOOK)
    fields = set(SweepSpec.model_fields)
    assert fields <= set(declared), sorted(fields - set(declared))
    assert {name: declared[name].default for name in fields} == dict.fromkeys(fields)


@pytest.mark.parametrize("profile", ["cpu", "l4-qwen3-8b"])
def test_profile_sweep_section_builds_a_spec_by_field_name(profile: str) -> None:
    from kvstudy.profiles import load_profile
    from kvstudy.speed.spec import SweepSpec

    section = load_profile(profile, ROOT / "profiles")["notebooks"]["02_speed-sweep"]
    params = {k: v for k, v in section.items() if k in SweepSpec.model_fields}
    spec = SweepSpec.from_params(**params)
    assert spec.input_len == section["input_len"] and spec.run_order == "abba"
    assert len(spec.seeds) >= 3


def test_cpu_profile_runs_the_workload_of_the_bundled_capture() -> None:
    """profiles/cpu.yaml's 02 section says it is the bundled CPU capture's workload: the two grids agree."""
    from kvstudy.capture import read_manifest
    from kvstudy.profiles import load_profile
    from kvstudy.speed.spec import SweepSpec

    section = load_profile("cpu", ROOT / "profiles")["notebooks"]["02_speed-sweep"]
    profile_spec = SweepSpec.from_params(**{k: v for k, v in section.items() if k in SweepSpec.model_fields})
    bundled = SweepSpec.from_dict(read_manifest(ROOT / "data" / "captures" / "speed-cpu")["spec"])
    assert profile_spec.to_dict() == bundled.to_dict()
