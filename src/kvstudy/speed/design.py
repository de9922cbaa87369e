"""What a speed comparison's design must be for its <= 5 % false-claim guarantee to hold.

The permutation test's guarantee is for a design fixed in advance and tested once:

* :func:`order_check` accepts only block designs (one run per arm per seed, a block's runs adjacent
  in time, blocks balanced in which arm runs first), since a nearly grouped order confounds drift
  with the arm; blocks all starting with the same arm pass only where the verdict bounds the drift;
* :func:`registration_check` refuses a verdict on fewer or more runs than registered per arm
  (testing after each added seed raises the false-claim rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

UNBALANCED = "blocks unbalanced"  # adjacent one-per-arm blocks, most starting with the same arm
DRIFT_BOUNDED = "alternating, drift estimated and bounded"


@dataclass(frozen=True)
class OrderCheck:
    """Whether a pair's run order lets the test tell drift from the effect."""

    accepted: bool | None  # None: start times not known
    overlap: bool | None  # the old, weak check: neither arm ran entirely before the other
    design: str  # "blocked, balanced (ABBA)" / "nearly grouped" / ...
    reason: str  # empty when accepted


def registration_check(n_base: int, n_cand: int, registered: int | None) -> str:
    """ "" when the runs match the registered number per arm (or none was registered); else the reason."""
    if registered is None:
        return ""
    if n_base < registered or n_cand < registered:
        return (
            f"incomplete design, no claim: {n_base} baseline and {n_cand} candidate runs of the "
            f"{registered} per arm registered before the runs"
        )
    if n_base > registered or n_cand > registered:
        return (
            f"more runs than the {registered} per arm registered ({n_base} / {n_cand}): a design grown "
            "until it reaches p < alpha does not keep the 5 % guarantee, no claim"
        )
    return ""


def order_check(
    base_starts: Sequence[float | None],
    cand_starts: Sequence[float | None],
    base_blocks: Sequence[int | None] | None = None,
    cand_blocks: Sequence[int | None] | None = None,
) -> OrderCheck:
    """Accept a block design (one run per arm per block, a block's runs adjacent in time, blocks
    balanced in which arm runs first); refuse any other order, nearly grouped ones included.

    With seeds known (``*_blocks``) the blocks are the seeds; without, consecutive pairs in time."""
    if any(t is None for t in (*base_starts, *cand_starts)) or not base_starts or not cand_starts:
        return OrderCheck(None, None, "unknown", "run start times not known: the run order cannot be checked")
    bs = [float(t) for t in base_starts]  # type: ignore[arg-type]
    cs = [float(t) for t in cand_starts]  # type: ignore[arg-type]
    overlap = not (max(bs) < min(cs) or max(cs) < min(bs))
    if not overlap:
        first = "baseline" if max(bs) < min(cs) else "candidate"
        return OrderCheck(
            False,
            False,
            "grouped",
            f"every {first} run started before every other run: the arms were not interleaved in time, "
            "so drift cannot be told from the effect",
        )
    known = base_blocks is not None and cand_blocks is not None
    known = known and all(b is not None for b in (*base_blocks, *cand_blocks))  # type: ignore[misc]
    if known:
        runs = sorted(
            [(t, "b", blk) for t, blk in zip(bs, base_blocks)]  # type: ignore[arg-type]
            + [(t, "c", blk) for t, blk in zip(cs, cand_blocks)]  # type: ignore[arg-type]
        )
        seq = [blk for _, _, blk in runs]
        firsts: list[str] = []
        for blk in dict.fromkeys(seq):
            where = [i for i, x in enumerate(seq) if x == blk]
            arms = sorted(runs[i][1] for i in where)
            if arms != ["b", "c"]:
                return OrderCheck(
                    False,
                    True,
                    "unblocked",
                    f"seed {blk} has {arms.count('b')} baseline and {arms.count('c')} candidate run(s), "
                    "not one of each: not a block design",
                )
            if where[-1] - where[0] != 1:
                return OrderCheck(
                    False,
                    True,
                    "blocks split in time",
                    f"the two runs of seed {blk} are not adjacent in time (other seeds ran between them): "
                    "drift between them is not removed by the block",
                )
            firsts.append(runs[where[0]][1])
    else:
        seq_arms = [arm for _, arm in sorted([(t, "b") for t in bs] + [(t, "c") for t in cs])]
        if len(bs) != len(cs):
            return OrderCheck(False, True, "unbalanced", f"{len(bs)} vs {len(cs)} runs: not a block design")
        pairs = [seq_arms[i : i + 2] for i in range(0, len(seq_arms), 2)]
        if any(sorted(p) != ["b", "c"] for p in pairs):
            order = "".join("A" if a == "b" else "B" for a in seq_arms)
            return OrderCheck(
                False,
                True,
                "nearly grouped",
                f"run order {order} (A baseline, B candidate) is not a sequence of AB/BA blocks: an order "
                "this close to grouped confounds drift with the arm",
            )
        firsts = [p[0] for p in pairs]
    n_b = sum(f == "b" for f in firsts)
    if abs(n_b - (len(firsts) - n_b)) > 1:
        return OrderCheck(
            False,
            True,
            UNBALANCED,
            f"the baseline ran first in {n_b} of {len(firsts)} blocks: a drift within blocks would not cancel "
            "(ABBA or balanced randomized blocks expected)",
        )
    return OrderCheck(True, True, "blocked, balanced (ABBA)", "")
