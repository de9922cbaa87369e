"""What notebooks import: repository root, sign convention, tables, settings origins, figures."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd
import pytest

from kvstudy.report import notebook


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "src" / "kvstudy").mkdir(parents=True)
    return tmp_path


def test_kernel_started_in_notebooks_moves_to_the_root(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo / "notebooks")
    assert notebook.use_repo_root(root=repo) == repo.resolve() and Path.cwd() == repo.resolve()


def test_folder_outside_the_repository_is_left_alone(
    repo: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    notebook.use_repo_root(root=repo)
    assert Path.cwd() == elsewhere.resolve()


def test_table_has_no_row_numbers_no_nan_and_integers_as_integers() -> None:
    df = pd.DataFrame(
        {"tokens": [2097152.0, math.nan], "name": ["a long name that stays whole", None], "share": [0.125, 1.5]}
    )
    page = notebook.table(df).data.replace("<td >", "<td>").replace("<th >", "<th>")  # pandas' Styler spaces them
    assert "<td>2,097,152</td>" in page and "2097152.0" not in page
    assert "NaN" not in page and "None" not in page and "no value" in page
    assert "<th>0</th>" not in page and "a long name that stays whole" in page and "<td>0.12</td>" in page


def test_settings_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = []
    monkeypatch.setattr(notebook, "display", lambda obj, metadata=None: shown.append((obj.data, metadata)))
    monkeypatch.setenv(notebook.GIVEN_ENV, '["model"]')
    notebook.settings_table(
        {"model": "m", "context_len": 4096, "weights_gib": 14.5}, origins={"weights_gib": notebook.FROM_MODEL}
    )
    text, meta = shown[0]
    assert "| model | `m` | given by the profile |" in text
    assert "| context_len | `4,096` | notebook default |" in text
    assert "| weights_gib | `14.50` | read from the model folder |" in text
    assert meta == {notebook.SETTINGS_KEY: True}


def test_save_figure_needs_a_title_and_writes_the_source(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    with pytest.warns(FutureWarning, match="has no title"):
        assert notebook.save_figure(fig, tmp_path, "bare").is_file()  # old calls still save
    path = notebook.save_figure(fig, tmp_path, "titled", title="Tokens per GiB", source="published L4 figures")
    assert path.is_file() and fig._suptitle.get_text() == "Tokens per GiB"
    assert any(t.get_text() == "Data: published L4 figures" for t in fig.texts)
    plt.close(fig)
    fig, ax = plt.subplots()
    ax.set_title("a title of its own")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert notebook.save_figure(fig, tmp_path, "compat").is_file()
    plt.close(fig)


def test_save_figure_draws_no_secret(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    token = "hf_PLANTEDsecret0123456789abcdefXYZ"
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label=f"models/{token}-model")
    ax.legend()
    ax.set_xlabel("https://user:pa55word@example.org/models")
    notebook.save_figure(fig, tmp_path, "leak", title=f"users vs context: /data/{token}", source="given")
    shown = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert not any(token in s or "pa55word" in s for s in shown), shown
    assert any("[REDACTED]" in s for s in shown) and any(s.startswith("users vs context") for s in shown)
    plt.close(fig)
