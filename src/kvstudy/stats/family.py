"""Many tests in one report: Holm's step-down adjustment of their p values.

The family-wise false-claim rate stays <= alpha over the tests of one report; statsmodels'
``multipletests(method="holm")`` computes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from statsmodels.stats.multitest import multipletests

MULTIPLICITY_METHOD = "Holm (step-down), family-wise false-claim rate <= alpha over the tests of one report"


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given (each capped at 1)."""
    if not p_values:
        return []
    adjusted = multipletests(np.asarray(p_values, dtype=float), method="holm")[1]
    return [float(q) for q in adjusted]
