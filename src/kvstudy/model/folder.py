"""Find a model's folder (a path, a config.json, or a Hugging Face cache id) and read its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import REPO_ROOT, read_json_object
from kvstudy.vllm.kv_specs import require_engine

# Model folders the project builds instead of bundling (not in git), and the command that builds them.
BUILT_MODELS = {Path("data/tiny-models"): "make engine tiny-model"}


def cached_snapshots(cache_dir: str | Path | None = None, asked: str | None = None) -> dict[str, Path]:
    """The newest snapshot of each model repository in the local Hugging Face cache (no network);
    ``asked``: the id being looked up, named when there is no cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound as exc:
        if asked:
            raise StudyError(f"{asked}: not a folder, and there is no Hugging Face cache at {exc.cache_dir}") from None
        raise StudyError(f"{exc.cache_dir}: no Hugging Face cache here (expected a hub cache folder)") from None
    return {
        repo.repo_id: Path(max(repo.revisions, key=lambda r: r.last_modified).snapshot_path)
        for repo in info.repos
        if repo.repo_type == "model" and repo.revisions
    }


def resolve_model_path(spec: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A model folder from a folder path, a path to its config.json, or a cached ``org/name`` id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    text = str(spec)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        found = cached_snapshots(cache_dir, text).get(text)
        if found is None:
            raise StudyError(
                f"{text}: not a folder and not in the local Hugging Face cache (expected a model folder, a config.json or a cached repo id)"
            )
        return found
    full = (REPO_ROOT / path).resolve()  # one of the project's built folders? (both resolved: it may be a symlink)
    command = next(
        (cmd for root, cmd in BUILT_MODELS.items() if full.is_relative_to((REPO_ROOT / root).resolve())), None
    )
    if command:
        raise MissingPrerequisite(f"{spec}: this model folder is built by the project and is not built here", command)
    raise StudyError(f"{spec}: no such model folder or file")


def require_live(model: str | Path, lm_eval: bool = False) -> None:
    """Before a live step serves ``model``: raise one :class:`MissingPrerequisite` naming everything
    missing here (vLLM, lm-eval where asked, a model folder the project builds) and the one command
    that provides it all."""
    found: list[MissingPrerequisite] = []
    for check in (lambda: require_engine(lm_eval), lambda: resolve_model_path(model)):
        try:
            check()
        except MissingPrerequisite as exc:
            found.append(exc)
    if len(found) == 1:
        raise found[0]
    if found:
        commands = " ".join(dict.fromkeys(w for exc in found for w in exc.command.removeprefix("make ").split()))
        raise MissingPrerequisite("; ".join(exc.missing for exc in found), f"make {commands}")


def config_path(spec: str | Path) -> Path:
    """The config.json that ``spec`` names (a file is taken as the config itself)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    folder = resolve_model_path(spec)
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise StudyError(f"{folder}: no config.json in this folder (expected a Hugging Face model folder)")
    return cfg


def load_config(spec: str | Path) -> tuple[dict[str, Any], Path]:
    """The parsed config.json for a folder, file or cache id, and the path it came from."""
    cfg = config_path(spec)
    return read_json_object(cfg), cfg  # its fields are checked where they are read (kvstudy.model.config_fields)
