"""Finding a model's folder (a path, a config.json, or a Hugging Face cache id), and the one rule for
reading its config.json: validate a field where it is read, and only the fields read.

A Hub config holds fields no figure of this project uses, in forms a strict JSON reader would refuse
(Nemotron-H's ``"time_step_limit": [0.0, Infinity]``, ``1e308``, ``null`` sizes of layers a family
leaves out, fields of another transformers version). They are accepted as they are: a config is
parsed, never checked as a whole, and each reader takes its field through :func:`config_int` (an
integer within its bound, else one line naming the file and field). Also which fields the KV rules
read and which they leave unread (for a refusal or an ``--assume`` warning that names them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstudy.errors import MissingPrerequisite, StudyError
from kvstudy.io import REPO_ROOT, read_json, read_json_object, short_repr, type_name
from kvstudy.limits import MAX_FILE_NUMBER, MAX_LAYERS
from kvstudy.vllm.facts import MODELOPT_KV_ALGO
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
    return read_json_object(cfg), cfg  # its fields are checked where they are read (below: config_int)


def config_int(
    cfg: dict[str, Any], key: str, where: str, low: int = 1, high: int = MAX_FILE_NUMBER, default: int | None = None
) -> int:
    """The integer field ``key`` within [low, high]; ``default`` when absent or null (required without one);
    else one line naming the file and the field (a float, text, a boolean, a 400-digit number)."""
    value = cfg.get(key)
    expected = "a positive integer" if low == 1 else f"an integer of at least {low:,}"
    if value is None:
        if default is None:
            raise StudyError(f"{where}: missing field '{key}' (expected {expected})")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise StudyError(f"{where}: field '{key}' is {type_name(value)} {short_repr(value)} (expected {expected})")
    if not low <= value <= high:
        bound = f"at most {high:,}" if value > high else expected
        raise StudyError(f"{where}: field '{key}' is {short_repr(value)} (expected {bound})")
    return value


# Fields that do not change the KV layout (checked by name or by these endings), left out of the
# "fields not understood" list of a refusal or an --assume warning.
NEUTRAL_FIELDS = frozenset(
    "architectures model_type torch_dtype dtype transformers_version use_cache tie_word_embeddings vocab_size "
    "hidden_size hidden_act hidden_activation initializer_range max_position_embeddings num_hidden_layers "
    "num_attention_heads num_key_value_heads head_dim intermediate_size auto_map quantization_config "
    "text_config vision_config audio_config bias attention_bias mlp_bias tokenizer_class pretraining_tp "
    "kv_lora_rank q_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim".split()
)
NEUTRAL_PARTS = tuple(
    "token_id rope dropout eps expert moe router routed topk _group scaling softcap logit norm init output_ "
    "aux_loss _act mlp ffn".split()
)


def unread_fields(cfg: dict[str, Any]) -> list[str]:
    """Fields of a config that may shape its KV cache and that no rule here reads (at most 12)."""
    names = [str(k) for k in cfg if str(k) not in NEUTRAL_FIELDS and not any(part in str(k) for part in NEUTRAL_PARTS)]
    return names[:12] + ([f"... {len(names) - 12} more"] if len(names) > 12 else [])


HF_QUANT_CONFIG = "hf_quant_config.json"


def checkpoint_kv_dtype(config: dict[str, Any], folder: Path | None = None) -> tuple[str | None, str | None]:
    """The KV dtype the checkpoint makes vLLM's ``--kv-cache-dtype auto`` store, and the file and field
    that say so; (None, None) when 'auto' stays the model dtype. vLLM's rules (vllm/vllm/facts.py
    KV_AUTO_FROM_CHECKPOINT): ModelOpt's ``kv_cache_quant_algo`` / ``kv_cache_scheme``, in config.json's
    ``quantization_config`` or, when config.json has none, in ``hf_quant_config.json``; a compressed-tensors
    ``kv_cache_scheme`` makes the attention layers store fp8."""
    quant, where = config.get("quantization_config"), "config.json quantization_config"
    if quant is None and folder is not None and (folder / HF_QUANT_CONFIG).is_file():
        quant, where = read_json(folder / HF_QUANT_CONFIG), HF_QUANT_CONFIG
    if not isinstance(quant, dict):
        return None, None
    nested_quant = quant.get("quantization")
    inner: dict[str, Any] = nested_quant if isinstance(nested_quant, dict) else quant
    producer = quant.get("producer")
    method = str(quant.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    modelopt = method.startswith("modelopt") or (isinstance(producer, dict) and producer.get("name") == "modelopt")
    if modelopt:
        nested = "quantization." if inner is not quant else ""
        for key in ("kv_cache_scheme", "kv_cache_quant_algo"):  # vLLM's order of looking
            for holder, prefix in ((inner, nested), (quant, "")):
                value = holder.get(key)
                if not value:
                    continue
                field = f"{where} {prefix}{key}"
                if isinstance(value, dict):
                    bits, kind = value.get("num_bits"), value.get("type")
                    if kind == "float" and bits == 8 and value.get("dynamic") is False:
                        return "fp8_e4m3", f"{field} (float 8-bit)"
                    if kind == "float" and bits == 4:
                        return "nvfp4", f"{field} (float 4-bit)"
                    return None, None
                dtype = MODELOPT_KV_ALGO.get(str(value).lower())
                return (dtype, f"{field} {str(value)[:20]!r}") if dtype else (None, None)
        return None, None
    if method == "compressed-tensors" and quant.get("kv_cache_scheme") is not None:
        return "fp8", f"{where}.kv_cache_scheme (compressed-tensors)"
    return None, None


def named_items(values: list[Any], key: str, names: dict[str, str], where: str) -> list[str]:
    """``names[item]`` for each item of the list field ``key``, else one line naming the item and what it may be."""
    for i, name in enumerate(values):
        if not isinstance(name, str) or name not in names:
            raise StudyError(f"{where}: field '{key}[{i}]' is {repr(name)[:60]} (expected one of {', '.join(names)})")
    return [names[name] for name in values]


def usable_int(value: Any, high: int = MAX_FILE_NUMBER) -> int | None:
    """``value`` when it is an integer in [1, high], else None (for fields read without refusing)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= high else None


# Fields a family's config may leave out, with the default its transformers config class applies.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "vocab_size": 262208,
        "tie_word_embeddings": True,
    },
    "gemma2": {"tie_word_embeddings": True},
    "llama4_text": {"no_rope_layer_interval": 4},
}


def text_config(config: dict[str, Any], defaults: dict[str, dict[str, Any]] = FAMILY_DEFAULTS) -> dict[str, Any]:
    """The language model's part of a config (``text_config`` over the top level), with ``defaults``
    per family filled in where absent (the roofline's estimates pass none)."""
    text = config.get("text_config")
    merged = dict(config)
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k not in ("text_config", "vision_config", "audio_config")}
        merged.update(text)
    for key, value in defaults.get(str(merged.get("model_type")), {}).items():
        if merged.get(key) is None:
            merged[key] = value
    return merged


def model_dtype(cfg: dict[str, Any], where: str) -> str:
    """The dtype vLLM serves the model in with ``--dtype auto`` (and so what KV 'auto' stores)."""
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    # vLLM reads a missing torch_dtype as float32, and serves float32 checkpoints in bfloat16 by default
    text = "float32" if value is None else str(value).removeprefix("torch.")
    served = {"bfloat16": "bfloat16", "float16": "float16", "float32": "bfloat16"}
    if text not in served:
        raise StudyError(f"{where}: field 'torch_dtype' is {value!r} (expected bfloat16, float16 or float32)")
    return served[text]


# Nemotron-H's block names (transformers 5.19 NemotronHConfig: ``layers_block_type``, with the legacy
# names ``mamba`` / ``attention`` remapped by configuration_utils._LEGACY_LAYER_TYPE_REMAP) as the
# characters of the ``hybrid_override_pattern`` vLLM's nemotron_h.py reads (the config's property).
NEMOTRON_H_BLOCKS = {
    "linear_attention": "M",
    "mamba": "M",
    "full_attention": "*",
    "attention": "*",
    "mlp": "-",
    "moe": "E",
}


def nemotron_h_pattern(cfg: dict[str, Any], where: str) -> str:
    """nemotron_h.py's layer pattern: 'M' Mamba-2, '*' attention, '-' MLP, 'E' MoE, one per layer.

    transformers 5 describes the layers with a ``layers_block_type`` list and derives
    ``num_hidden_layers`` from its length (NemotronHConfig.num_hidden_layers ignores the field);
    older configs give the ``hybrid_override_pattern`` string."""
    blocks = cfg.get("layers_block_type")
    if blocks is not None:
        if not isinstance(blocks, list) or not 0 < len(blocks) <= MAX_LAYERS:
            raise StudyError(
                f"{where}: field 'layers_block_type' must list 1 to {MAX_LAYERS:,} block names "
                f"({', '.join(NEMOTRON_H_BLOCKS)})"
            )
        return "".join(named_items(blocks, "layers_block_type", NEMOTRON_H_BLOCKS, where))
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_LAYERS:
        raise StudyError(
            f"{where}: field 'hybrid_override_pattern' must be a string of 1 to {MAX_LAYERS:,} characters "
            "(M, *, -, E), or 'layers_block_type' a list of block names"
        )
    if set(pattern) - set("M*-E"):
        raise StudyError(
            f"{where}: field 'hybrid_override_pattern' has {sorted(set(pattern) - set('M*-E'))} (expected M, *, - or E)"
        )
    return pattern
