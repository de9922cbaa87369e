"""Profiles: YAML files in ``profiles/`` that give each notebook its parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError


def load_profile(profile: str, profiles_dir: Path) -> dict[str, Any]:
    """The parameters of ``profiles/<profile>.yaml``: ``description``, ``defaults``, ``notebooks``."""
    import yaml

    path = profiles_dir / f"{profile}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in profiles_dir.glob("*.yaml"))) or "none"
        raise StudyError(f"{path}: no such profile (profiles available: {names})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: malformed YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a mapping with 'description', 'defaults' and 'notebooks'")
    for key in ("defaults", "notebooks"):
        if not isinstance(data.get(key) or {}, dict):
            raise StudyError(f"{path}: field '{key}' must be a mapping")
    return data


def notebook_parameters(profile_data: dict[str, Any], stem: str, profile: str,
                        figures_dir: Path) -> dict[str, Any]:
    params = dict(profile_data.get("defaults") or {})
    params.update((profile_data.get("notebooks") or {}).get(stem) or {})
    params.setdefault("profile", profile)
    params.setdefault("figures_dir", str(figures_dir))
    return params
