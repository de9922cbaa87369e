"""Strict profiles: names, keys and types checked against the notebooks; extends; profile new."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import yaml

from kvstudy import profiles
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]
PARAMS = (
    'profile = "x"  # profile\nfigures_dir = "f"  # figures\nmodel = "m"  # a model\n'
    "gib = 22.5  # memory in GiB\nweights: Optional[float] = None  # weights in GiB\n"
    'flag = False  # a switch\nnames = ["a"]  # a list\nloose = None  # no type given\n'
)


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "profiles").mkdir()
    for stem in ("01_a", "02_b"):
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell(PARAMS)
        cell.metadata["tags"] = ["parameters"]
        nb.cells = [cell]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / "notebooks" / f"{stem}.ipynb")
    return tmp_path


def check(study: Path, text: str, name: str = "p") -> dict:
    (study / "profiles" / f"{name}.yaml").write_text(text)
    data = profiles.load_profile(name, study / "profiles")
    profiles.validate_profile(data, study / "notebooks")
    return data


def test_declared_parameters_carry_types(study: Path) -> None:
    declared = profiles.declared_parameters(study / "notebooks" / "01_a.ipynb")
    assert list(declared) == ["profile", "figures_dir", "model", "gib", "weights", "flag", "names", "loose"]
    assert declared["gib"].annotation == float | None
    assert declared["weights"].annotation == float | None and declared["names"].annotation is list
    assert declared["flag"].annotation is bool and declared["loose"].annotation is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("notebooks:\n  01_a: {modle: x}\n", "notebook 01_a: unknown parameter 'modle'; did you mean 'model'?"),
        ("notebooks:\n  09_x: {}\n", "notebook '09_x' is not in notebooks/"),
        ("notebooks:\n  01_a: {gib: '80'}\n", "parameter 'gib': expected a valid number, got '80'"),
        ("notebooks:\n  01_a: {flag: 'no'}\n", "parameter 'flag': expected a valid boolean, got 'no'"),
        ("notebooks:\n  01_a: {flag: null}\n", "parameter 'flag': expected a valid boolean, got None"),
        ("notebooks:\n  01_a: {names: a}\n", "parameter 'names': expected a valid list, got 'a'"),
        ("notebooks:\n  01_a: {model: 5}\n", "parameter 'model': expected a valid string, got 5"),
        ("notebooks:\n  01_a: {weights: true}\n", "parameter 'weights': expected a valid number, got True"),
        ("notebooks:\n  01_a: {profile: y}\n", "set by the runner"),
        ("notebooks:\n  01_a: {loose: anything}\n", "parameter 'loose' is declared without a type in 01_a.ipynb"),
        ("defaults: {nope: 1}\nnotebooks:\n  01_a: {}\n", "defaults: no notebook of this profile declares 'nope'"),
        ("notebook:\n  01_a: {}\n", "notebook: unknown field"),
        ("extends: p\n", "extends: 'p' makes a cycle"),
        # hand-written profiles (issue 35 item 8, issue 30's second corpus): duplicates, odd keys, paths
        ("notebooks:\n  01_a:\n    gib: 1\n    gib: 2\n", "key 'gib' is given twice"),
        ("notebooks:\n  01_a: {}\nnotebooks:\n  02_b: {}\n", "key 'notebooks' is given twice"),
        ("notebooks:\n  01_a: {}\n  01_a: {gib: 2}\n", "key '01_a' is given twice"),
        ("notebooks:\n  01_a:\n    ~: 1\n", "notebooks.01_a.None.[key]: expected a valid string, got None"),
        ("notebooks:\n  01_a:\n    4096: gib\n", "notebooks.01_a[4096].[key]: expected a valid string, got 4096"),
        ("defaults:\n  ~: 1\n", "defaults.None.[key]: expected a valid string"),
        ("notebooks:\n  5: {}\n", "notebooks[5].[key]: expected a valid string, got 5"),
        ("extends: ../other\n", "extends: '../other' is not a profile name"),
        ("extends: /etc/passwd\n", "extends: '/etc/passwd' is not a profile name"),
        ("extends: [a]\n", "extends: ['a'] is not a profile name"),
        ("extends: nowhere\n", "extends: "),
    ],
)
def test_bad_profile_is_one_line_naming_profile_notebook_key(study: Path, text: str, message: str) -> None:
    with pytest.raises(StudyError) as info:
        check(study, text)
    assert message in str(info.value) and "p.yaml" in str(info.value) and "\n" not in str(info.value)


def test_good_values_pass(study: Path) -> None:
    data = check(study, "notebooks:\n  01_a: {gib: 80, weights: 15, flag: true, names: [b], model: m2}\n")
    assert list(data["notebooks"]) == ["01_a"]


def test_extends_takes_the_base_settings(study: Path) -> None:
    check(study, "notebooks:\n  01_a: {gib: 80, model: base}\n  02_b: {}\n", name="base")
    data = check(study, "extends: base\nnotebooks:\n  01_a: {model: mine}\n")
    assert data["notebooks"] == {"01_a": {"gib": 80, "model": "mine"}, "02_b": {}}
    declared = profiles.declared_parameters(study / "notebooks" / "01_a.ipynb")
    assert profiles.given_parameters(data, "01_a", declared) == {"gib": 80, "model": "mine"}


@pytest.mark.parametrize("name", ["../profiles/reference", "reference.yaml", "a/b", ".hidden"])
def test_profile_names_are_plain(name: str) -> None:
    with pytest.raises(StudyError, match="give the name of a file in profiles/"):
        profiles.check_profile_name(name)


@pytest.mark.parametrize("path", sorted((ROOT / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_repository_profiles_are_valid(path: Path) -> None:
    data = profiles.load_profile(path.stem, ROOT / "profiles")
    profiles.validate_profile(data, ROOT / "notebooks")


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_bundled_notebook_parameter_has_a_type_a_profile_is_checked_against(notebook: Path) -> None:
    untyped = [n for n, p in profiles.declared_parameters(notebook).items() if p.annotation is None]
    assert untyped == [], f"{notebook.name}: parameters without a type (a profile could set them to anything)"


def test_a_bundled_optional_number_refuses_a_string_from_a_profile(tmp_path: Path) -> None:
    """`gpu_memory_gib: "Optional[float]" = None` (01_capacity-math): a profile's "80" is one line."""
    (tmp_path / "p.yaml").write_text("notebooks:\n  01_capacity-math: {gpu_memory_gib: '80'}\n")
    data = profiles.load_profile("p", tmp_path)
    with pytest.raises(StudyError, match=r"parameter 'gpu_memory_gib': expected a valid number, got '80'"):
        profiles.validate_profile(data, ROOT / "notebooks")
    (tmp_path / "p.yaml").write_text("notebooks:\n  01_capacity-math: {gpu_memory_gib: 80}\n")
    profiles.validate_profile(profiles.load_profile("p", tmp_path), ROOT / "notebooks")


def test_profile_new_writes_a_valid_commented_profile(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    path = profiles.write_profile("mine", "data/models/Mistral-7B-v0.1", "H100-SXM", root=tmp_path)
    text = path.read_text()
    assert text.startswith("# Profile mine") and "make all PROFILE=mine" in text
    data = yaml.safe_load(text)
    capacity = data["notebooks"]["01_capacity-math"]
    assert capacity["model"] == "data/models/Mistral-7B-v0.1"
    assert "H100" in text and ("gpu" in capacity or capacity["gpu_memory_gib"] > 70)
    assert "02_speed-sweep" not in data["notebooks"]  # live notebooks only as comments
    with pytest.raises(StudyError, match="the profile exists"):
        profiles.write_profile("mine", "data/models/Mistral-7B-v0.1", None, root=tmp_path)


def test_profile_new_refuses_an_unknown_gpu(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    with pytest.raises(StudyError, match="not in the GPU catalog"):
        profiles.write_profile("mine", "data/models/Qwen3-8B", "Z9000", root=tmp_path)
    assert not (tmp_path / "profiles" / "mine.yaml").exists()


def test_profile_new_force_keeps_the_old_profile_when_the_new_one_fails(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    path = profiles.write_profile("mine", "data/models/Qwen3-8B", "H100-SXM", root=tmp_path)
    before = path.read_text()
    with pytest.raises(StudyError, match="not in the GPU catalog"):
        profiles.write_profile("mine", "data/models/Qwen3-8B", "Z9000", root=tmp_path, force=True)
    with pytest.raises(StudyError, match="control characters"):
        profiles.write_profile("mine", "data/models/Qwen3-8B\nnotebooks: {}", None, root=tmp_path, force=True)
    with pytest.raises(StudyError, match="URL with credentials"):
        profiles.write_profile("mine", "https://user:hunter2@example.invalid/model", None, root=tmp_path, force=True)
    assert path.read_text() == before
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == ["mine.yaml"]  # no scratch left


def test_profiles_are_read_within_the_yaml_limits(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    (tmp_path / "bomb.yaml").write_text(bomb + "notebooks: {}\n")
    with pytest.raises(StudyError, match="bomb.yaml"):
        profiles.load_profile("bomb", tmp_path)


def test_profile_new_refuses_a_planted_symlink_even_with_force(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    outside = tmp_path / "outside.yaml"
    outside.write_text("keep: me\n")
    (tmp_path / "profiles" / "mine.yaml").symlink_to(outside)
    with pytest.raises(StudyError, match="mine.yaml: is a symlink; refusing to write through it"):
        profiles.write_profile("mine", "data/models/Mistral-7B-v0.1", None, root=tmp_path, force=True)
    assert outside.read_text() == "keep: me\n" and (tmp_path / "profiles" / "mine.yaml").is_symlink()


def test_a_long_extends_chain_is_refused_naming_extends(study: Path) -> None:
    for i in range(1200):
        text = f"extends: c{i + 1}\n" if i < 1199 else "notebooks: {}\n"
        (study / "profiles" / f"c{i}.yaml").write_text(text)
    with pytest.raises(StudyError, match=r"extends: a chain of more than 32 profiles"):
        profiles.load_profile("c0", study / "profiles")
    (study / "profiles" / "c5.yaml").write_text("notebooks:\n  01_a: {gib: 3}\n")  # six deep: fine
    assert profiles.load_profile("c0", study / "profiles")["notebooks"] == {"01_a": {"gib": 3}}
