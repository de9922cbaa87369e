"""Users within the target: the knee rule on hand values, synthetic cells with a known knee, noise
alone (no claim) and the A/A false-claim rate by simulation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvstudy.load.analysis import HELD, MEASURED, MISSED, NO_CELLS, Knee, compare_users, decide, users_within
from kvstudy.load.runner import share_within
from kvstudy.stats.binary import clopper_pearson

LOADS = [2, 4, 6, 8, 12]


def simulate_cells(
    loads: list[int], capacity: float, rng: np.random.Generator, noise: float = 0.05, requests: int = 30
) -> dict[int, float]:
    """Synthetic shares within the target along a ladder: near 1 up to ``capacity`` users, falling
    past it, with binomial request noise and a per-cell jitter of ``noise``."""
    out = {}
    for load in loads:
        base = 0.97 if load <= capacity else max(0.0, 0.97 - 0.6 * (load - capacity) / capacity)
        p = float(np.clip(base + rng.normal(0, noise), 0, 1))
        out[load] = rng.binomial(requests, p) / requests
    return out


def aa_false_claim_rate(
    loads: list[int], capacity: float, blocks: int, trials: int, noise: float, seed: int
) -> tuple[int, int]:
    """(claims, trials) over simulated A/A designs: two arms with the same capacity, ``blocks`` seed
    blocks each, the knee rule and the claim rule as the report runs them."""
    rng = np.random.default_rng(seed)
    claims = 0
    for _ in range(trials):
        base = {s: users_within(simulate_cells(loads, capacity, rng, noise), 0.9) for s in range(blocks)}
        cand = {s: users_within(simulate_cells(loads, capacity, rng, noise), 0.9) for s in range(blocks)}
        c = compare_users("a", "a-repeat", base, cand)
        decide([c])
        claims += c.claim != "no claim"
    return claims, trials


@pytest.fixture
def no_full_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    """statsmodels' ``multipletests(method="holm")`` ends with ``gc.collect()``: late in a test run (a
    large heap) each took up to 0.6 s, and the simulations below call it hundreds of times. A
    collection changes no result, so these tests skip it."""
    import gc

    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)


def test_share_within_is_vllms_goodput_rule() -> None:
    target = {"ttft": 2000.0, "tpot": 100.0}

    def request_within(success: bool, ttft: float, tpot: float | None, e2el: float, target: dict[str, float]) -> bool:
        record = SimpleNamespace(success=success, ttft_ms=ttft, tpot_ms=tpot, e2el_ms=e2el)
        return share_within([record], target) == (1, 1)

    assert request_within(True, 1999, 99, 99999, target)
    assert not request_within(True, 2001, 50, 0, target)
    assert not request_within(True, 10, 101, 0, target)
    assert request_within(True, 10, None, 0, target)  # one output token: TPOT 0, as vLLM counts it
    assert not request_within(False, 1, 1, 1, target)  # a failed request is never within
    assert not request_within(True, 1, 1, 5001, {"e2el": 5000.0})
    records = [SimpleNamespace(success=True, ttft_ms=t, tpot_ms=1.0, e2el_ms=1.0) for t in (10, 3000, 20)]
    assert share_within(records, target) == (2, 3)


def test_knee_hand_values() -> None:
    assert users_within({2: 1.0, 4: 0.95, 6: 0.5, 8: 0.2}, 0.9) == Knee(4, MEASURED, 4, 6)
    # the first miss ends the count even if a later load meets it again
    assert users_within({2: 1.0, 4: 0.5, 6: 1.0}, 0.9) == Knee(2, MEASURED, 2, 4)
    assert users_within({2: 0.8, 4: 0.1}, 0.9) == Knee(0, MISSED, None, 2)
    assert users_within({2: 1.0, 4: 0.9}, 0.9) == Knee(4, HELD, 4, None)
    assert users_within({2: None, 4: None}, 0.9).state == NO_CELLS
    assert users_within({2: 1.0, 4: None}, 0.9) == Knee(2, MEASURED, 2, 4)  # a cell that did not run is a miss


def test_synthetic_cells_with_a_known_knee_are_found() -> None:
    rng = np.random.default_rng(1)
    found = [users_within(simulate_cells(LOADS, 4, rng, noise=0.02, requests=60), 0.9).users for _ in range(50)]
    found8 = [users_within(simulate_cells(LOADS, 8, rng, noise=0.02, requests=60), 0.9).users for _ in range(50)]
    for knee, got in ((4, found), (8, found8)):
        assert np.mean([u == knee for u in got]) >= 0.8  # exact in most ladders
        assert max(got) <= knee  # never past the known knee
        assert np.mean([LOADS.index(u) >= LOADS.index(knee) - 1 for u in got if u]) >= 0.95  # within one step


def _blocks(capacity: float, n: int, seed: int) -> dict[int, Knee]:
    rng = np.random.default_rng(seed)
    return {s: users_within(simulate_cells(LOADS, capacity, rng, 0.02, 60), 0.9) for s in range(n)}


def test_a_doubled_capacity_is_claimed_with_enough_blocks() -> None:
    c = compare_users("auto", "fp8", _blocks(4, 6, 1), _blocks(8, 6, 2))
    decide([c])
    assert c.ratio == pytest.approx(2.0, rel=0.2)
    assert c.ratio_low is not None and c.ratio_low > 1
    assert c.claim == "more users", c.reasons


def test_three_blocks_cannot_claim_and_say_why() -> None:
    c = compare_users("auto", "fp8", _blocks(4, 3, 1), _blocks(8, 3, 2))
    decide([c])
    assert c.claim == "no claim"
    assert c.min_p_value == pytest.approx(0.25)
    assert any("cannot reach p < 0.05" in r for r in c.reasons)


def test_noise_alone_claims_nothing() -> None:
    rng = np.random.default_rng(7)
    flat = {s: users_within({load: float(rng.uniform(0.95, 1.0)) for load in LOADS}, 0.9) for s in range(6)}
    again = {s: users_within({load: float(rng.uniform(0.95, 1.0)) for load in LOADS}, 0.9) for s in range(6)}
    c = compare_users("auto", "auto-repeat", flat, again)
    decide([c])
    assert c.claim == "no claim"  # every block held at every load: bounds, not knees


def test_a_censored_arm_is_never_claimed() -> None:
    base = {s: Knee(4, MEASURED, 4, 6) for s in range(6)}
    cand = {s: Knee(12, HELD, 12, None) for s in range(6)}
    c = compare_users("auto", "fp8", base, cand)
    decide([c])
    assert c.p_value is not None and c.p_value < 0.05
    assert c.claim == "no claim" and any("bound" in r for r in c.reasons)


def test_holm_runs_over_the_family() -> None:
    c = compare_users("auto", "fp8", _blocks(4, 6, 1), _blocks(8, 6, 2))
    decide([c], other_p=[0.01, 0.02, 0.03])
    assert c.p_holm is not None and c.p_holm >= c.p_value


def test_aa_false_claim_rate_at_most_five_percent(no_full_collections: None) -> None:
    """Two identical arms, 6 seed blocks each (a design that can reach p < 0.05), 400 designs: the claim
    rule's false-claim rate, with the upper end of its 95 % Clopper-Pearson interval under 10 %."""
    claims, trials = aa_false_claim_rate(LOADS, 4, blocks=6, trials=400, noise=0.08, seed=3)
    low, high = clopper_pearson(claims, trials)
    assert claims / trials <= 0.05, (claims, trials)
    assert high < 0.10


def test_the_aa_check_can_fail(no_full_collections: None) -> None:
    """The same simulation with arms of different capacity claims often: the check is not vacuous."""
    rng = np.random.default_rng(0)
    claims = 0
    for _ in range(40):
        base = {s: users_within(simulate_cells(LOADS, 4, rng, 0.02, 60), 0.9) for s in range(6)}
        cand = {s: users_within(simulate_cells(LOADS, 8, rng, 0.02, 60), 0.9) for s in range(6)}
        c = compare_users("a", "b", base, cand)
        decide([c])
        claims += c.claim != "no claim"
    assert claims / 40 > 0.5


def test_blocks_for_family_hand_values() -> None:
    from kvstudy.load.analysis import blocks_for_family

    assert blocks_for_family(1) == 6  # 2/64 < 0.05 <= 2/32
    assert blocks_for_family(10) == 9  # 10 x 2/512 = 0.039; 10 x 2/256 = 0.078
    assert blocks_for_family(12) == 9  # the L4 profile's family: 12 x 2/512 = 0.047
