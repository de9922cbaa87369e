"""The precision tables and verdicts show small numbers without e-notation; their CSV keeps them."""

from __future__ import annotations

import json
import re

from kvstudy.precision import analysis, records

E_NOTATION = re.compile(r"\d(?:\.\d+)?e[-+]?\d")
RECORD = {
    "group": "m",
    "bucket": "gsm8k",
    "label": "FP8 e5m2, scale 1.0",
    "role": "candidate",
    "prompts": 100,
    "tokens": 14271,
    "mean": -4.41e-04,
    "low": -8.01e-04,
    "high": -8.07e-05,
    "p": 2.31e-05,
    "top1": 0.9992,
    "floor_p": 0.419,
    "verdict": "loss",
    "engine": "simulated",
}


def test_comparison_table_shows_millinats_and_p_below_a_thousandth() -> None:
    shown = analysis.comparison_table([RECORD])
    assert not any(E_NOTATION.search(str(v)) for v in shown.iloc[0]), shown.iloc[0].to_dict()
    assert shown.loc[0, "mean Δ log p (millinats/token)"] == "-0.441"
    assert shown.loc[0, "clustered 95% (millinats/token)"] == "-0.801 to -0.0807"
    assert shown.loc[0, "p"] == "< 0.001"
    full = analysis.comparison_table([RECORD], shown=False)  # the CSV: the values themselves
    assert full.loc[0, "mean Δ log p (nats/token)"] == -4.41e-04 and full.loc[0, "p"] == 2.31e-05


def test_verdicts_say_p_below_a_thousandth() -> None:
    text = analysis.verdict(2.31e-05, -0.0015, 0.419)
    assert text == "loss (p < 0.001; A/A floor p = 0.419)"
    assert "p = 0.0676 >= 0.05" in analysis.verdict(0.0676, -0.0002, 0.419)


def test_captured_settings_read_the_capture_spec(tmp_path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps({"kind": records.KIND, "spec": {"gsm8k_n": 100, "groups": ["m"]}}), encoding="utf-8"
    )
    assert records.captured_settings(tmp_path, False, ("gsm8k_n", "greedy_n")) == {"gsm8k_n": 100}
    assert records.captured_settings(tmp_path, True, ("gsm8k_n",)) == {}  # a live run: the parameters apply
    assert records.captured_settings(tmp_path / "none", False, ("gsm8k_n",)) == {}
