"""A tiny random-weight Qwen3 model, built offline and deterministically, for the live CPU paths.

No model hub is reachable where the study runs, so the CPU profile serves a model made here: a real
Qwen3's KV layout scaled down, random weights from a fixed seed (bfloat16 safetensors) and a
byte-level BPE tokenizer trained on a generated corpus. Its text is garbage: for plumbing, speed and
capacity, never accuracy. The ``speed`` size exists because the 4-layer model's decode step was
shorter than the API server's per-token streaming work on a loaded 2-core machine, so per-token
latency was not measurable. The marker file is written last: a half-built folder is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.outputs import TINY_MODEL_MARKER, record_says
from kvstudy.tools.checkpoints import write_json

DEFAULT_PATH = Path("data/tiny-models/tiny-qwen3")
SPEED_PATH = Path("data/tiny-models/speed-qwen3")
MARKER = TINY_MODEL_MARKER
BUILD_VERSION = 1  # bump when the recipe changes, so stale folders are rebuilt

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, BOS_TOKEN)

# Files a build writes; a folder holding only these (and no marker) is a half-built one.
KNOWN_FILES = {MARKER, "config.json", "generation_config.json", "model.safetensors", "chat_template.jinja"}
KNOWN_FILES |= {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}

# A minimal chat template so /v1/chat/completions works too (the study uses completions).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

WORDS = (
    "the a an and or but if then so of to in on at by for with from as is are was were be been "
    "has have had do does did not no yes it its this that these those there here he she they we "
    "you i his her their our my your who what when where why how which many much more less most "
    "each every all some any one two three four five six seven eight nine ten hundred thousand "
    "half twice times total left right after before per day days week weeks month year years hour "
    "hours minute minutes dollar dollars cent cents price cost costs pay paid buy buys bought sell "
    "sells sold earn earns earned spend spends spent save saves saved give gives gave take takes "
    "took make makes made get gets got need needs want wants has apple apples orange oranges egg "
    "eggs cookie cookies book books page pages car cars mile miles pound pounds box boxes bag bags "
    "student students class teacher school friend friends family mother father sister brother "
    "farm farmer cow cows chicken chickens dog dogs cat cats store shop money water cup cups "
    "glass tree trees garden flower flowers ticket tickets game games team player players point "
    "points number numbers answer question problem left over remaining together altogether each "
    "than equal sum difference product quotient add subtract multiply divide percent rate speed "
    "work job hourly weekly daily first second third last next new old big small long short"
).split()


@dataclass(frozen=True)
class TinyModelSpec:
    """The recipe; it is written into the marker file so a folder says how it was made."""

    seed: int = 1234
    num_hidden_layers: int = 4
    hidden_size: int = 256
    intermediate_size: int = 512
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 8192
    vocab_size: int = 1024
    corpus_lines: int = 4000
    build_version: int = BUILD_VERSION


# Named sizes for `kvstudy tiny-model build --size`: ``tiny`` for plumbing and capacity, ``speed``
# for the CPU speed sweep (decode steps long enough to be measured one token at a time).
SIZES: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    "speed": TinyModelSpec(
        num_hidden_layers=6,
        hidden_size=768,
        intermediate_size=2048,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
    ),
}
DEFAULT_PATHS: dict[str, Path] = {"tiny": DEFAULT_PATH, "speed": SPEED_PATH}


def sha256_file(path: Path) -> str:
    """The full sha256 of a file (a model folder's record lists each)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def folder_digests(folder: Path, skip: tuple[str, ...] = ("training.json", "SOURCE.md")) -> dict[str, str]:
    """sha256 of every file a model folder holds, but ``skip``."""
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name not in skip}


def corpus_lines(seed: int, count: int) -> Iterator[str]:
    """Deterministic training text: word sentences, arithmetic and GSM8K-style Q/A lines."""
    rng = random.Random(seed)
    for i in range(count):
        kind = i % 4
        if kind == 0:
            words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
            yield " ".join(words).capitalize() + rng.choice((".", "?", "!"))
        elif kind == 1:
            a, b = rng.randint(0, 999), rng.randint(1, 999)
            op, val = rng.choice((("+", a + b), ("-", a - b), ("*", a * b), ("/", round(a / b, 2))))
            yield f"{a} {op} {b} = {val}. <<{a}{op}{b}={val}>>"
        elif kind == 2:
            n, p = rng.randint(2, 60), rng.randint(1, 40)
            noun = rng.choice(("apples", "books", "eggs", "tickets", "cookies", "cups"))
            yield f"Question: A store sells {n} {noun} for ${p} each. How much do {n} {noun} cost?"
        else:
            n, p = rng.randint(2, 60), rng.randint(1, 40)
            yield f"Answer: {n} * {p} = <<{n}*{p}={n * p}>>{n * p}. The total is {n * p} dollars.\n#### {n * p}"


def build_tokenizer(spec: TinyModelSpec) -> Any:
    """Train a byte-level BPE tokenizer on the generated corpus (deterministic for a given spec)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(spec.seed, spec.corpus_lines), trainer=trainer)
    return tok


# the shape of a Qwen3 model, as a TinyModelSpec and the trained model's settings both name it
SHAPE_FIELDS = (
    "hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads head_dim "
    "max_position_embeddings"
).split()


def new_qwen3(spec: Any, tokenizer: Any, **extra: Any) -> Any:
    """The untrained float32 ``Qwen3ForCausalLM`` of ``spec``'s shape (a ``TinyModelSpec`` or the trained model's
    settings), initialised from ``spec.seed``, its vocabulary, BOS and EOS ``tokenizer``'s."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    shape = {name: getattr(spec, name) for name in SHAPE_FIELDS}
    bos, eos = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    ids = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}
    config = Qwen3Config(vocab_size=tokenizer.get_vocab_size(), **shape, tie_word_embeddings=True, **ids, **extra)
    return Qwen3ForCausalLM(config)


def save_folder(model: Any, tokenizer: Any, out: Path, **extra: Any) -> None:
    """Save ``model`` in bfloat16 (safetensors, with the generation config of its BOS and EOS) and ``tokenizer``
    wrapped for transformers (and vLLM), with BOS/EOS and the chat template."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    bos, eos = model.config.bos_token_id, model.config.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=model.config.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
        **extra,
    ).save_pretrained(out)


def _check_replaceable(folder: Path) -> None:
    """Refuse to replace anything but an empty folder or one carrying the tiny model's own marker
    (a real model folder holds the same standard file names: only the marker proves it is ours)."""
    if folder.is_symlink():
        raise StudyError(f"{folder}: is a symlink; refusing to replace it (expected the tiny model's folder)")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise StudyError(f"{folder}: exists and is not a folder (expected the tiny model's folder)")
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in KNOWN_FILES)
    if foreign:
        raise StudyError(
            f"{folder}: holds files a tiny-model build does not write ({', '.join(foreign[:3])}); "
            "expected an empty folder or a tiny-model folder; pick another path"
        )
    if any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise StudyError(
            f"{folder}: not empty and has no {MARKER} marker, so it is not a tiny model "
            "this project built; refusing to delete it (pick another path)"
        )


def build_tiny_model(path: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Build the model into ``path`` (replacing a half-built or stale one) and return the folder."""
    folder = Path(path)
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # removed on the way out, unless moved in place
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.building-", dir=folder.parent) as name:
        tmp = Path(name)
        try:
            tokenizer = build_tokenizer(spec)
            save_folder(new_qwen3(spec, tokenizer), tokenizer, tmp)
        except ModuleNotFoundError as exc:
            raise StudyError(
                f"tiny-model: the package {exc.name!r} is not installed (the build needs torch, "
                "transformers and tokenizers: run `make engine`)"
            ) from None
        marker = {
            "spec": asdict(spec),
            "files": folder_digests(tmp, skip=(MARKER,)),
            "note": "random weights (fixed seed) and a locally trained tokenizer: for plumbing, not accuracy",
        }
        write_json(tmp / MARKER, marker)
        for item in tmp.iterdir():
            item.chmod(0o644)
        tmp.chmod(0o755)
        _check_replaceable(folder)  # again: a folder left by an interrupted build is replaced
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    return folder


def ensure_tiny_model(path: str | Path = DEFAULT_PATH, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """The model's folder for ``spec``, built only when missing, half-built or made by another recipe. A lock file
    next to the folder serialises concurrent callers (parallel test sessions)."""
    folder, built = Path(path), record_says(MARKER, "spec", lambda made: made == asdict(spec))
    if built(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(folder):  # another process built it while we waited
            return folder
        return build_tiny_model(folder, spec)
