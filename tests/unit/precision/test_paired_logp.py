"""The screen's statistics on synthetic data: clustered mean, McNemar, verdicts, A/A false claims."""

from __future__ import annotations

import numpy as np
import pytest

from kvstudy.errors import StudyError
from kvstudy.precision import analysis as pl
from kvstudy.stats.binary import clustered_mean


def _rows(values: list[list[float]], prefix: str = "p") -> list[dict]:
    return [
        {"id": f"{prefix}{i}", "bucket": "gsm8k", "cluster": f"c{i}", "logp": v, "top1": [1] * len(v)}
        for i, v in enumerate(values)
    ]


def test_identical_arms_make_no_claim() -> None:
    rows = _rows([[-1.0, -2.0], [-0.5, -0.1]])
    paired = pl.pair_rows(rows, rows)
    assert paired.test.mean == 0.0 and paired.test.p_value == 1.0 and paired.top1_agreement == 1.0
    assert pl.verdict(paired.test.p_value, paired.test.mean, 1.0).startswith("no claim")


def test_a_clear_loss_is_claimed_only_without_a_rejecting_floor() -> None:
    rng = np.random.default_rng(0)
    base = [list(rng.normal(-1, 0.5, 20)) for _ in range(30)]
    cand = [[x - 0.3 + rng.normal(0, 0.05) for x in row] for row in base]
    paired = pl.pair_rows(_rows(base), _rows(cand))
    assert paired.test.mean < -0.25 and paired.test.p_value < 1e-6 and paired.test.clusters == 30
    assert paired.test.ci_low < paired.test.mean < paired.test.ci_high < 0
    assert pl.verdict(paired.test.p_value, paired.test.mean, 0.5).startswith("loss")
    assert "floor rejects" in pl.verdict(paired.test.p_value, paired.test.mean, 0.01)
    assert "higher" in pl.verdict(paired.test.p_value, -paired.test.mean, 0.5)


def test_clustering_widens_the_interval() -> None:
    rng = np.random.default_rng(1)
    shifts = np.repeat(rng.normal(0, 1, 10), 50)
    values = shifts + rng.normal(0, 0.1, 500)
    clustered = clustered_mean(values, np.repeat(np.arange(10).astype(str), 50))
    naive = clustered_mean(values, np.arange(500).astype(str))
    assert clustered.ci_high - clustered.ci_low > 3 * (naive.ci_high - naive.ci_low)


def false_claim_rate(n_sim: int, n_clusters: int, tokens: int, seed: int, alpha: float = 0.05) -> tuple[float, float]:
    """(rate of rejections, rate of claimed losses) when both arms (the candidate and the A/A floor)
    differ by noise only: per-cluster offsets and per-token noise of mean zero."""
    rng = np.random.default_rng(seed)
    rejects = claims = 0
    labels = np.repeat(np.arange(n_clusters).astype(str), tokens)
    for _ in range(n_sim):
        tests = []
        for _arm in range(2):
            shift = np.repeat(rng.normal(0, 0.05, n_clusters), tokens)
            tests.append(clustered_mean(shift + rng.standard_t(4, labels.size) * 0.02, labels, alpha))
        rejects += tests[0].p_value < alpha
        claims += pl.verdict(tests[0].p_value, tests[0].mean, tests[1].p_value, alpha).startswith("loss")
    return rejects / n_sim, claims / n_sim


def test_a_a_false_claim_rate_is_at_most_5_percent() -> None:
    rejects, claims = false_claim_rate(n_sim=400, n_clusters=30, tokens=15, seed=3)
    assert rejects <= 0.05 + 2 * (0.05 * 0.95 / 400) ** 0.5  # the test alone: its nominal 5 %, within noise
    assert claims <= 0.05  # claimed losses: one-sided and gated by the floor


def test_pairing_refuses_mismatched_rows() -> None:
    with pytest.raises(StudyError, match="one arm only"):
        pl.pair_rows(_rows([[-1.0]]), _rows([[-1.0]], prefix="q"))
    with pytest.raises(StudyError, match="different tokenizers"):
        pl.pair_rows(_rows([[-1.0]]), _rows([[-1.0, -2.0]]))


def test_the_analysis_side_imports_without_torch() -> None:
    """Notebook 07 renders with the analysis environment: none of these modules imports torch."""
    import subprocess
    import sys

    code = (
        "import sys; import kvstudy.precision.analysis, kvstudy.precision.records, "
        "kvstudy.precision.simulate, kvstudy.tools.checkpoints; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
