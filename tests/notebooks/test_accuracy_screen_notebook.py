"""Notebook 06 shows the screen of a capture's own servers when the capture holds one: the bundled
retrieval capture, copied, with made-up screen rows (a test fixture, not a measurement) added to
its three configurations."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from kvstudy.accuracy import screening as sc

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "06_retrieval-accuracy.ipynb"


def _rows(shift: float) -> list[dict]:
    rows = []
    for i, p in enumerate(sc.prompts_for("retrieval_offline", ROOT / "data" / "retrieval", 64)):
        s = shift * (1 + (i % 5) / 10)
        probs = [0.6 - s, 0.3 + s, 0.05]
        top = [[7 + j, math.log(q)] for j, q in enumerate(probs)]
        rows.append(
            {"id": p.id, "bucket": p.bucket, "cluster": p.cluster, "prompt_tokens": 9, "logp": [math.log(probs[0])] * 2,
             "top1": ["7", "7"], "topk": [top, top], "echo_sha256": "same"}
        )  # fmt: skip
    return rows


@pytest.mark.notebooks
def test_the_screen_table_and_verdict_render(tmp_path: Path) -> None:
    import papermill

    capture = tmp_path / "retrieval"
    shutil.copytree(ROOT / "data" / "captures" / "retrieval-cpu", capture)
    for name, shift in (("bf16", 0.0), ("bf16-repeat", 0.001), ("fp8-kv", 0.05)):
        (capture / name / sc.ROWS).write_text("".join(json.dumps(r) + "\n" for r in _rows(shift)))
        status = {"state": "ok", "top_k": 3, "prompts": 64, "prompts_sha256": "x", "root": "models/m"}
        (capture / name / sc.STATUS).write_text(json.dumps(status))
    out = tmp_path / "06.ipynb"
    params = {"capture_dir": str(capture), "figures_dir": str(tmp_path / "figures"), "margin_kl": 0.5}
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=params, cwd=str(ROOT), progress_bar=False)
    outputs = [o for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])]
    text = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    html = "\n".join("".join(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert "Not screened in this capture" not in text
    assert "FP8 KV cache against 16-bit (the engine itself" in text and "not calibrated margin of 500" in text
    assert "KL (millinats/token)" in html and "A/A floor" in html and "retrieval 4096" in html
    verdict = next(
        o["metadata"]["kvstudy_verdict"] for o in outputs if "kvstudy_verdict" in o.get("metadata", {})
    )  # fmt: skip
    facts = verdict["facts"]
    assert facts["screen_state"] == "measured" and facts["screen_equivalence"] in ("within", "undecided")
    assert facts["screen_kl_mean"] > 0 and facts["screen_top1_agreement"] == 1.0
