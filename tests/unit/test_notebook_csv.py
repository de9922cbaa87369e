"""Every table a report shows is also written as CSV (``notebook.csv_tables``), headers in words."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from kvstudy.report import notebook


@pytest.fixture
def csv_folder(tmp_path: Path):
    notebook.csv_tables(tmp_path / "figures", "09")
    yield tmp_path / "figures"
    notebook._CSV.update(folder=None, prefix="", count=0)


def test_headers_in_words_with_units() -> None:
    assert notebook.human_header("median_tpot_ms") == "median TPOT (ms)"
    assert notebook.human_header("output_throughput_tok_s") == "output throughput (tokens/s)"
    assert notebook.human_header("kv_cache_dtype") == "KV cache dtype"
    assert notebook.human_header("median_clock_mhz") == "median clock (MHz)"
    assert notebook.human_header("p99 (ms)") == "p99 (ms)"  # already a reader's name
    assert notebook.human_header(3) == 3


def test_each_table_shown_is_written_as_csv_with_its_values(csv_folder: Path) -> None:
    frame = pd.DataFrame({"median_tpot_ms": [7.123456, 8.5], "measured": [True, False]})
    shown = notebook.styled(frame) + notebook.table_csv(frame)  # what a kernel shows for display(frame)
    assert "median TPOT (ms)" in shown and "median_tpot_ms" not in shown.split("As CSV")[0]
    assert re.search(r"<td[^>]*>yes</td>", shown) and "True" not in shown
    assert re.search(r"<td[^>]*>8.5</td>", shown) and "<th" not in shown.split("<tbody>")[1]  # no row numbers
    assert "As CSV: <code>09-table-1.csv</code>" in shown  # an absolute folder is not named
    back = pd.read_csv(csv_folder / "09-table-1.csv")
    assert back["median_tpot_ms"].tolist() == [7.123456, 8.5]  # the values, not display strings
    html = notebook.table(pd.DataFrame({"a": [1.0, None]})).data
    assert "09-table-2.csv" in html and (csv_folder / "09-table-2.csv").is_file()


def test_settings_and_provenance_are_written_too(csv_folder: Path) -> None:
    notebook.settings_table({"users": [1, 4], "margin_points": 2.0}, {"margin_points": notebook.ASSUMED})
    settings = pd.read_csv(csv_folder / "09-settings.csv")
    assert settings.to_dict("records")[1] == {"setting": "margin_points", "value": "2.0", "origin": notebook.ASSUMED}
    shown = notebook.provenance(alpha=0.05).data
    assert "09-provenance.csv" in shown and (csv_folder / "09-provenance.csv").is_file()


def test_without_a_folder_nothing_is_written(tmp_path: Path) -> None:
    notebook._CSV.update(folder=None, prefix="", count=0)
    assert notebook.table_csv(pd.DataFrame({"a": [1]})) == ""
    assert list(tmp_path.iterdir()) == []


def test_a_frame_shows_a_dash_for_a_missing_value_and_integers_as_integers() -> None:
    shown = notebook.styled(pd.DataFrame({"tokens": [2097152.0, float("nan")], "name": ["a", None]}))
    assert re.search(r"<td[^>]*>2097152</td>", shown) and "2097152.0" not in shown
    assert "NaN" not in shown and "None" not in shown and f">{notebook.MISSING}</td>" in shown and "no value" in shown


def test_a_styled_table_is_written_from_its_data(csv_folder: Path) -> None:
    frame = pd.DataFrame({"tokens_per_gib": [7281.777]})
    shown = notebook._styler_html(frame.style.format("{:,.0f}"))
    assert "7,282" in shown and "tokens per GiB" in shown and "09-table-1.csv" in shown
    assert pd.read_csv(csv_folder / "09-table-1.csv")["tokens_per_gib"].tolist() == [7281.777]


def test_report_table_headers_in_words() -> None:
    shown = notebook.table(pd.DataFrame({"log_kv_dtype": ["fp8"], "agree": [True]})).data
    assert re.search("<th ?>log KV dtype</th>", shown) and re.search("<td ?>yes</td>", shown)


def test_an_earlier_runs_numbered_tables_do_not_outlive_it(tmp_path: Path) -> None:
    (tmp_path / "09-table-7.csv").write_text("a\n1\n")
    (tmp_path / "09-verdicts.csv").write_text("a\n1\n")
    notebook.csv_tables(tmp_path, "09")
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["09-verdicts.csv"]
    finally:
        notebook._CSV.update(folder=None, prefix="", count=0)


def test_a_table_of_formatted_numbers_writes_its_values(csv_folder: Path) -> None:
    shown = pd.DataFrame({"p": ["< 0.001"]})
    html = notebook.table(shown, values=pd.DataFrame({"p": [2.31e-05]})).data
    assert "&lt; 0.001" in html and "09-table-1.csv" in html
    assert pd.read_csv(csv_folder / "09-table-1.csv")["p"].tolist() == [2.31e-05]  # full precision
