"""The trained mini model: its recipe reproduces the committed loss curve's start, its folder
matches the digests its training recorded, and the retrieval generator is deterministic and
answerable from its contexts."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from kvstudy.errors import StudyError
from kvstudy.tools import retrieval_data, tiny_model, train_data, train_model

ROOT = Path(__file__).resolve().parents[3]
FOLDER = ROOT / "data" / "trained-model" / "qwen3-mini"
TRAINING = FOLDER / "training.json"


def _training() -> dict:
    if not TRAINING.is_file():
        pytest.fail(f"{TRAINING}: missing (kvstudy train-model --out {FOLDER})")
    return json.loads(TRAINING.read_text(encoding="utf-8"))


def test_first_steps_reproduce_the_committed_loss_curve() -> None:
    pytest.importorskip("torch")
    record = _training()
    settings = train_data.settings_from_dict(record["settings"])
    committed = record["first_losses"][:3]
    result = train_model.train(settings, max_steps=3)[1][0]
    assert len(result.losses) == 3
    # Same seeds, same data, same thread count: only float summation order may differ by CPU.
    assert result.losses == pytest.approx(committed, rel=2e-3, abs=2e-3)
    assert result.losses[2] < result.losses[0]  # the loss falls, so training does something


def test_folder_matches_the_recorded_digests() -> None:
    record = _training()
    files = record["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    on_disk = {p.name for p in FOLDER.iterdir() if p.is_file()} - {"training.json", "SOURCE.md"}
    assert on_disk == set(files)
    for name, digest in files.items():
        assert tiny_model.sha256_file(FOLDER / name) == digest, name
    source = (FOLDER / "SOURCE.md").read_text(encoding="utf-8")
    assert files["model.safetensors"] in source


def test_committed_tokenizer_is_bos_then_bytes() -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FOLDER)
    text = "Question: Ava has 25 cards.\nAnswer: 25 * 3 = <<25*3=75>>75\n#### 75"
    ids = tok(text)["input_ids"]
    assert ids == [train_model.BOS_ID] + train_data.encode(text)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.eos_token_id == train_model.EOS_ID


def test_training_batches_never_hold_a_test_question() -> None:
    settings = train_data.settings_from_dict(_training()["settings"])
    excluded = train_data.test_questions()
    parts = train_model.batch_for_step(settings, 0, excluded)
    gsm = next(inputs for part, inputs, _ in parts if part == "gsm")
    text = bytes(t for t in gsm[0] if t < 256).decode("utf-8")
    questions = re.findall(r"Question: (.*?)\nAnswer:", text)
    assert questions and not set(questions) & excluded


@pytest.mark.parametrize("length", [256, 448, 1024])
def test_retrieval_sequences_count_only_whole_answers(length: int) -> None:
    """No answer is cut by the sequence's end: every labelled run is a whole answer or key."""
    for index in range(12):
        inputs, labels = train_data.retrieval_sequence(random.Random(f"t:{length}:{index}"), length, 4, 0.5)
        assert len(inputs) == len(labels) == length
        runs, run = [], []
        for token in labels + [train_model.IGNORE]:
            if token != train_model.IGNORE:
                run.append(token)
            elif run:
                runs.append(bytes(run).decode("utf-8"))
                run = []
        assert runs
        for text in runs:  # each labelled run is a whole answer, " ddddd\n\n"
            assert re.fullmatch(r" \d{5}\n\n", text), text


def test_retrieval_generator_is_deterministic() -> None:
    first = retrieval_data.generate_items("kv", [512, 1024], 6, seed=7, questions_per_context=2)
    again = retrieval_data.generate_items("kv", [512, 1024], 6, seed=7, questions_per_context=2)
    other = retrieval_data.generate_items("kv", [512, 1024], 6, seed=8, questions_per_context=2)
    assert first == again
    assert [i["context"] for i in first] != [i["context"] for i in other]
    assert len({i["context_id"] for i in first}) == 6  # two questions per context


@pytest.mark.parametrize("kind", retrieval_data.KINDS)
@pytest.mark.parametrize("length", [256, 2048])
def test_retrieval_answers_are_in_their_contexts(kind: str, length: int) -> None:
    items = retrieval_data.generate_items(kind, [length], 8, seed=11)
    for item in items:
        key = re.search(r"(?:value of|number for) ([a-z]{5})\?", item["question"]).group(1)
        if kind == "kv":
            lines = dict(line.split(": ") for line in item["context"].split("\n"))
            assert lines[key] == item["answer"]
        else:
            assert f"The special magic number for {key} is {item['answer']}." in item["context"]
            assert item["context"].count(key) == 1
        assert abs(item["context_tokens_approx"] - length) < max(64, 0.1 * length)
        prompt = retrieval_data.prompt_text(item)
        assert prompt.endswith(f"{item['question']}\nAnswer: {item['answer_prefix']}")
        # RULER's answer prefix: the context's words just before the value, so it is copied after them
        assert f"{item['answer_prefix']} {item['answer']}" in item["context"]
    depths = [item["depth"] for item in items]
    assert depths[0] < 0.25 and depths[-1] > 0.75
    if kind == "kv" or length >= 2048:  # fine-grained enough for the depths to come in order
        assert depths == sorted(depths)


def test_retrieval_training_spans_are_the_answers() -> None:
    text, spans = retrieval_data.training_text("kv", 300, random.Random(3), 4)
    for start, end in spans:
        value = text[start:end].strip()
        key = re.findall(r"value of ([a-z]{5})\?\nAnswer: \1:$", text[:start])[-1]
        assert f"{key}: {value}" in text


def test_echo_sequences_count_only_the_repeat() -> None:
    excluded = train_data.test_questions()
    for index in range(8):
        inputs, labels = train_data.echo_sequence(random.Random(f"echo:{index}"), 384, excluded)
        assert len(inputs) == len(labels) == 384
        text = bytes(t for t in inputs if t < 256).decode("utf-8")
        labelled = bytes(t for t in labels if t != train_model.IGNORE).decode("utf-8")
        assert labelled and len(labelled) < len(text) / 2 + 1  # only the second saying counts
        for question in re.findall(r"Question: (.*?)\n", text)[:-1]:  # the last may be cut
            assert f"Again: {question}" in text and question not in excluded


def test_an_earlier_recipes_data_version_is_refused() -> None:
    settings = dataclasses.asdict(train_model.TrainSettings())
    with pytest.raises(StudyError, match="data_version 2"):
        train_data.settings_from_dict({**settings, "data_version": 2})
    old = {k: v for k, v in settings.items() if k != "data_version"}
    with pytest.raises(StudyError, match="data_version 1"):
        train_data.settings_from_dict(old)


def test_retrieval_rejects_bad_input() -> None:
    with pytest.raises(StudyError, match="kind"):
        retrieval_data.generate_items("haystack", [512], 2)
    with pytest.raises(StudyError, match="target_tokens"):
        retrieval_data.generate_items("kv", [4], 2)


def test_arith_lines_are_right_and_count_only_the_result() -> None:
    rng = random.Random("arith-test")
    ops = set()
    for _ in range(400):
        text, mask = train_data.arith_line(rng)
        match = train_data.STEP_RE.fullmatch(text.rstrip("\n"))
        assert match, text
        expr, calc, value, shown = match.groups()
        assert calc == expr.replace(" ", "") and value == shown
        assert eval(calc.replace("/", "//")) == int(value) and int(value) >= 0  # noqa: S307 (digits and + - * / only)
        if "/" in calc and "100" not in calc:
            first, second = (int(x) for x in calc.split("/"))
            assert first % second == 0  # quotients are exact, as in the templates
        assert len(mask) == len(text) and mask == [0] * len(expr) + [1] * (len(text) - len(expr))
        ops.add(next(op for op in "+-*/" if op in calc))
    assert ops == set("+-*/")


def test_settings_round_trip_and_refuse_the_two_phase_record() -> None:
    settings = train_model.TrainSettings()
    assert train_data.settings_from_dict(json.loads(json.dumps(dataclasses.asdict(settings)))) == settings
    # the recipe before phases were a list (phase A's schedule at the top) is an older format, refused
    two_phase = {k: v for k, v in dataclasses.asdict(settings).items() if k != "phases"}
    two_phase |= {"lr": 8e-4, "warmup_steps": 50, "needle_share": 0.3, "stages": []}
    with pytest.raises(StudyError, match=r"^training.json settings: lr: .*expected the fields of TrainSettings"):
        train_data.settings_from_dict(two_phase)
    with pytest.raises(StudyError, match="training.json settings: phases.0.seed_tag"):
        train_data.settings_from_dict({**dataclasses.asdict(settings), "phases": [{"name": "A"}]})
    with pytest.raises(StudyError, match="training.json settings: seed: Input should be a valid integer"):
        train_data.settings_from_dict({**dataclasses.asdict(settings), "seed": True})


def _small_recipe(phases: int) -> train_model.TrainSettings:
    stage = train_data.Stage(2, 1, 64, 1, 32, 1, 96, 1, echo_seqs=1, echo_len=64, arith_seqs=1, arith_len=32)
    recipe = tuple(train_data.Phase(name, tag, 1e-3, 1, 0.5, (stage,)) for name, tag in (("A", ""), ("B", "b")))
    return dataclasses.replace(
        train_model.TrainSettings(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        threads=1,
        phases=recipe[:phases],
    )


def test_a_later_phase_continues_a_saved_folder(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    first = train_model.run_training(tmp_path / "a", _small_recipe(1), progress=None)
    assert first["steps"] == [2] and "continued_from" not in first
    record = train_model.run_training(tmp_path / "ab", _small_recipe(2), progress=None, start=tmp_path / "a")
    assert record["steps"] == [2, 2]
    assert record["first_losses"] == first["first_losses"]
    assert record["continued_from"]["files"] == first["files"] and record["continued_from"]["phases"] == 1
    assert record["files"]["model.safetensors"] != first["files"]["model.safetensors"]
    assert train_data.settings_from_dict(record["settings"]) == _small_recipe(2)
    # another recipe's first phase, or a folder whose files changed, is not continued
    with pytest.raises(StudyError, match="not this one's first 1 phase"):
        train_model.run_training(tmp_path / "out", _small_recipe(2).scaled(2), progress=None, start=tmp_path / "a")
    with pytest.raises(StudyError, match="no training.json"):
        train_model.run_training(tmp_path / "out", _small_recipe(2), progress=None, start=tmp_path)
    (tmp_path / "a" / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(StudyError, match="config.json: its content differs from the digest"):
        train_model.run_training(tmp_path / "out", _small_recipe(2), progress=None, start=tmp_path / "a")


def test_rounding_between_phases_is_what_saving_and_loading_does() -> None:
    """Parameters are rounded to bfloat16; RoPE's inv_freq (not saved, recomputed in float32 on load)
    is not: casting the whole module rounded it, and phase B then ran with other RoPE frequencies
    than a saved and reloaded model has."""
    torch = pytest.importorskip("torch")
    model = train_model.new_model(_small_recipe(1))
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    rounded = train_model.round_to_bfloat16(model)
    assert buffers and all(torch.equal(b, buffers[name]) for name, b in rounded.named_buffers())
    for name, p in rounded.named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(p, params[name].to(torch.bfloat16).to(torch.float32)), name


def _tampered(folder: Path, change: str) -> None:
    """Change a copy of a saved folder the way a hostile or damaged one differs."""
    record = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    if change == "no steps":
        del record["steps"]
    elif change == "steps a number":
        record["steps"] = 2
    elif change == "steps not the recipe's":
        record["steps"] = [3]
    elif change == "files a list":
        record["files"] = ["model.safetensors"]
    elif change == "config and its digest rewritten":
        config["num_hidden_layers"] = 7
        (folder / "config.json").write_text(json.dumps(config))
        record["files"]["config.json"] = tiny_model.sha256_file(folder / "config.json")
    elif change == "a file missing":
        (folder / "model.safetensors").unlink()
    elif change == "a file linked":
        (folder / "model.safetensors").rename(folder.parent / "elsewhere.safetensors")
        (folder / "model.safetensors").symlink_to(folder.parent / "elsewhere.safetensors")
    elif change == "an extra file":
        (folder / "notes.bin").write_bytes(b"x")
    (folder / "training.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    "change, message",
    [
        ("no steps", "training.json: steps: Field required"),
        ("steps a number", "training.json: steps: Input should be a valid list"),
        ("steps not the recipe's", "training.json: steps is [3], expected [2]"),
        ("files a list", "training.json: files: Input should be a valid dictionary"),
        ("config and its digest rewritten", "config.json: num_hidden_layers is 7, expected 1 (the recipe's model)"),
        ("a file missing", "model.safetensors: missing (training.json lists it"),
        ("a file linked", "model.safetensors: a symbolic link"),
        ("an extra file", "notes.bin: not among the files training.json lists"),
    ],
)
def test_continue_from_a_tampered_folder_names_what(
    trained_once: Path, tmp_path: Path, change: str, message: str
) -> None:
    """Issue 35 item 7 and issue 30's second corpus: one line naming what was tampered or is missing."""
    folder = tmp_path / "copy"
    shutil.copytree(trained_once, folder)
    _tampered(folder, change)
    with pytest.raises(StudyError, match=re.escape(message)) as info:
        train_model.run_training(tmp_path / "out", _small_recipe(2), progress=None, start=folder)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("trained") / "a"
    train_model.run_training(out, _small_recipe(1), progress=None)
    return out


def test_a_folder_transformers_cannot_load_is_one_line(trained_once: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(trained_once, folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    record = json.loads((folder / "training.json").read_text())
    record["files"]["model.safetensors"] = tiny_model.sha256_file(folder / "model.safetensors")  # digest kept true
    (folder / "training.json").write_text(json.dumps(record))
    with pytest.raises(StudyError, match=r"copy: cannot be loaded as the saved model \("):
        train_model.run_training(tmp_path / "out", _small_recipe(2), progress=None, start=folder)
