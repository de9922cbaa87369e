"""Generators and writers never destroy what they did not write (issue 25): a folder they did not
create is refused unless ``--force``, another set's data is refused always, a planted symlink is
refused, and ``capacity --csv PATH`` writes exactly PATH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstudy import cli
from kvstudy.errors import StudyError
from kvstudy.io import write_json_atomic, write_text_atomic
from kvstudy.precision import records, simulate
from kvstudy.tools import checkpoints, retrieval_data, train_data
from kvstudy.tools.retrieval_data import RetrievalSet

ROOT = Path(__file__).resolve().parents[3]
GENERATED_MARKER = ".kvstudy-generated.json"  # kvstudy.outputs.GENERATED_MARKER
SMALL = RetrievalSet(lengths=(64,), n_per_length=2, questions_per_context=1, n_needles=1)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, expecting the one-line refusal; returns it."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_checkpoints_build_refuses_a_folder_it_did_not_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "models" / "plain-bf16"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own model notes")
    err = _error(capsys, ["checkpoints", "build", str(tmp_path / "models"), "plain-bf16"])
    assert "not written by `kvstudy checkpoints build`" in err and "--force" in err
    assert (mine / "notes.txt").read_text() == "my own model notes"
    assert cli.main(["checkpoints", "build", str(tmp_path / "models"), "plain-bf16", "--force"]) == 0
    assert (mine / "model.safetensors").is_file()
    # its own folder is rebuilt without --force
    assert cli.main(["checkpoints", "build", str(tmp_path / "models"), "plain-bf16"]) == 0


def test_checkpoints_build_never_follows_a_symlinked_case_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    out = tmp_path / "ck"
    out.mkdir()
    (out / "plain-bf16").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StudyError, match="is a symlink"):
        checkpoints.build_all(out, ["plain-bf16"])
    assert (outside / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]


def test_retrieval_and_gsm8k_data_never_overwrite_each_others_test_file(tmp_path: Path) -> None:
    gsm = tmp_path / "gsm8k"
    train_data.write_splits(gsm, n_test=3, n_train=8)
    before = (gsm / "test.jsonl").read_bytes()
    with pytest.raises(StudyError, match="holds the output of `kvstudy gsm8k-data`"):
        retrieval_data.write_retrieval_data(gsm, SMALL)
    with pytest.raises(StudyError, match="holds the output of `kvstudy gsm8k-data`"):
        retrieval_data.write_retrieval_data(gsm, SMALL, force=True)  # another set's data: never
    assert (gsm / "test.jsonl").read_bytes() == before
    retrieval = tmp_path / "retrieval"
    retrieval_data.write_retrieval_data(retrieval, SMALL)
    kept = (retrieval / "test.jsonl").read_bytes()
    with pytest.raises(StudyError, match="holds the output of `kvstudy retrieval-data`"):
        train_data.write_splits(retrieval, n_test=3, n_train=8, force=True)
    assert (retrieval / "test.jsonl").read_bytes() == kept
    retrieval_data.write_retrieval_data(retrieval, SMALL)  # its own folder: rewritten


def test_data_generators_refuse_an_unmarked_folder_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text('{"question": "mine", "answer": "#### 1"}\n')
    for argv in (["retrieval-data", str(data), "--lengths", "64"], ["gsm8k-data", str(data)]):
        err = _error(capsys, argv)
        assert f"{data}: not empty and not written by" in err
        assert (data / "test.jsonl").read_text() == '{"question": "mine", "answer": "#### 1"}\n'
    assert cli.main(["gsm8k-data", str(data), "--n-test", "3", "--n-train", "8", "--force"]) == 0
    assert json.loads((data / GENERATED_MARKER).read_text()) == {"generator": "gsm8k-data"}


def test_bad_settings_are_refused_before_the_folder_is_touched(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="n_train >= 8"):
        train_data.write_splits(tmp_path / "new", n_train=2)
    assert not (tmp_path / "new").exists()


def test_a_planted_symlink_at_a_written_file_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text("keep me\n")
    folder = tmp_path / "retrieval"
    retrieval_data.write_retrieval_data(folder, SMALL)
    (folder / "test.jsonl").unlink()
    (folder / "test.jsonl").symlink_to(outside)
    with pytest.raises(StudyError, match="test.jsonl: is a symlink"):
        retrieval_data.write_retrieval_data(folder, SMALL)
    assert outside.read_text() == "keep me\n" and (folder / "test.jsonl").is_symlink()
    link = tmp_path / "link.json"
    link.symlink_to(outside)
    with pytest.raises(StudyError, match="link.json: is a symlink; refusing to write through it"):
        write_json_atomic(link, {"a": 1})
    with pytest.raises(StudyError, match="is a folder"):
        write_text_atomic(tmp_path, "x")
    assert outside.read_text() == "keep me\n"


def test_capacity_csv_writes_exactly_the_path_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(ROOT / "data" / "models" / "Qwen3-8B")
    for name in ("table.txt", "no-suffix", "two.dots.csv"):
        target = tmp_path / name
        assert cli.main(["capacity", model, "--csv", str(target)]) == 0
        assert target.read_text().startswith("kv dtype,")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-suffix", "table.txt", "two.dots.csv"]
    capsys.readouterr()
    (tmp_path / "mine.csv").write_text("my data\n")
    err = _error(capsys, ["capacity", model, "--csv", str(tmp_path / "mine.csv")])
    assert "mine.csv: exists; refusing to replace it" in err and (tmp_path / "mine.csv").read_text() == "my data\n"
    assert cli.main(["capacity", model, "--csv", str(tmp_path / "mine.csv"), "--force"]) == 0


def test_control_checkpoint_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    source = ROOT / "data" / "trained-model" / "qwen3-mini"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    with pytest.raises(StudyError, match="not written by `kvstudy control-checkpoint`"):
        checkpoints.build_control(source, mine)
    assert (mine / "config.json").read_text() == '{"mine": true}'


def test_kv_screen_refuses_a_foreign_folder_before_asking_any_server(tmp_path: Path) -> None:
    mine = tmp_path / "cap"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"kind": "kvstudy speed sweep"}')
    items = records.scored_prompts(1, [], 0)
    # port 9 (discard) is never asked: the folder is refused first
    with pytest.raises(StudyError, match="not written by `kvstudy kv-screen`"):
        records.screen("http://127.0.0.1:9", "http://127.0.0.1:9", mine, items)
    assert (mine / "manifest.json").read_text() == '{"kind": "kvstudy speed sweep"}'
    assert [p.name for p in mine.iterdir()] == ["manifest.json"]  # not even a marker written


def test_kv_simulate_refuses_a_foreign_folder_before_any_work(tmp_path: Path) -> None:
    mine = tmp_path / "cap"
    mine.mkdir()
    (mine / "results.csv").write_text("mine\n")
    with pytest.raises(StudyError, match="not written by `kvstudy kv-simulate`"):
        simulate.run(simulate.SimSpec(control_dir=str(tmp_path / "control")), mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"] and (mine / "results.csv").read_text() == "mine\n"


def test_the_bundled_data_folders_are_their_generators_own() -> None:
    for folder, generator in (
        ("checkpoints", "checkpoints build"),
        ("gsm8k", "gsm8k-data"),
        ("retrieval", "retrieval-data"),
    ):
        marker = json.loads((ROOT / "data" / folder / GENERATED_MARKER).read_text())
        assert marker == {"generator": generator}


@pytest.mark.parametrize("command", ["gsm8k-data", "retrieval-data", "checkpoints build", "capacity --csv"])
@pytest.mark.parametrize("where", ["parent-is-a-file", "name-too-long"])
def test_unwritable_output_paths_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, where: str
) -> None:
    (tmp_path / "a-file").write_text("x")
    target = str(tmp_path / "a-file" / "out") if where == "parent-is-a-file" else str(tmp_path / ("n" * 300))
    argv = {
        "gsm8k-data": ["gsm8k-data", target],
        "retrieval-data": ["retrieval-data", target, "--lengths", "64"],
        "checkpoints build": ["checkpoints", "build", target],
        "capacity --csv": ["capacity", str(ROOT / "data" / "models" / "Qwen3-8B"), "--csv", target],
    }[command]
    assert target[:40] in _error(capsys, argv)
    assert (tmp_path / "a-file").read_text() == "x"


def test_train_model_refuses_a_foreign_folder_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstudy.tools import train_model

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started")

    monkeypatch.setattr(train_model, "train", no_training)
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    with pytest.raises(StudyError, match="not written by `kvstudy train-model`"):
        train_model.run_training(mine, progress=None)
    assert (mine / "config.json").read_text() == '{"mine": true}'
    before_markers = tmp_path / "saved-before-markers"
    before_markers.mkdir()
    (before_markers / "training.json").write_text('{"what": "kvstudy\'s trained mini Qwen3"}')
    with pytest.raises(AssertionError, match="training started"):  # its own folder: training starts
        train_model.run_training(before_markers, progress=None)


@pytest.mark.parametrize("record", ["{}", '{"source": 5}', '{"generator": null}'])
def test_a_record_without_the_generators_own_value_is_not_recognised(tmp_path: Path, record: str) -> None:
    """Only the value a generator wrote before markers existed makes an unmarked folder its own."""
    for name in ("spec.json", "control.json"):
        (tmp_path / name).write_text(record)
    with pytest.raises(StudyError, match="not written by `kvstudy retrieval-data`"):
        retrieval_data.write_retrieval_data(tmp_path, SMALL)
    with pytest.raises(StudyError, match="not written by `kvstudy control-checkpoint`"):
        checkpoints.build_control(ROOT / "data" / "trained-model" / "qwen3-mini", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.json", "spec.json"]
