"""A mean over items that share a cluster, with a cluster-robust (sandwich) standard error.

Items that share a context (several needles in one haystack, the tokens of one prompt) are not
independent: the per-item residuals are summed per cluster and the variance is
``G/(G-1) * sum_g S_g^2 / n^2``, with a t interval and a two-sided t test of mean = 0 on G - 1
degrees of freedom. It is the standard error of statsmodels' ``OLS(...).fit(cov_type="cluster",
use_t=True)`` on a constant (the tests check that), written out so that items all scored alike
give an error of exactly 0 (a least-squares fit leaves rounding residue there): with no variation
the interval is the mean itself and p is 1 at a mean of 0, else 0. With fewer than two clusters
there is no clustered error: it, the interval and p are NaN. With one item per cluster it equals
the ordinary standard error.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from kvstudy.errors import StudyError
from kvstudy.stats.binary import ALPHA, paired_counts


@dataclass(frozen=True)
class ClusteredMean:
    """A mean over items with an independent and a cluster-robust standard error."""

    n: int
    clusters: int
    mean: float
    se_independent: float
    se_clustered: float  # NaN with fewer than two clusters
    ci_low: float  # t interval on clusters - 1 degrees of freedom, clustered error
    ci_high: float
    p_value: float  # two-sided t test of mean = 0 (NaN with fewer than two clusters)

    @property
    def varies(self) -> bool:
        """False when the clustered error is 0 (e.g. every item scored alike) or NaN: no interval then."""
        return self.se_clustered > 0

    @property
    def design_effect(self) -> float:
        """Variance inflation from clustering (1 when the items behave as independent)."""
        if self.se_independent == 0:
            return 1.0 if self.se_clustered == 0 else math.inf
        return (self.se_clustered / self.se_independent) ** 2


def clustered_mean(
    values: Sequence[float] | npt.NDArray[np.float64],
    clusters: Sequence[Hashable] | npt.NDArray[np.str_],
    alpha: float = ALPHA,
) -> ClusteredMean:
    """Mean of per-item values with the cluster-robust (sandwich) standard error, interval and p."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) != len(clusters):
        raise StudyError(f"clusters: expected one cluster id per item, got {len(clusters)} ids for {x.size} items")
    if x.size == 0:
        raise StudyError("clustered mean: no values")
    if not np.all(np.isfinite(x)):
        raise StudyError("clustered mean: values are not all finite")
    _, index = np.unique(np.asarray([repr(c) for c in clusters]), return_inverse=True)
    groups = int(index.max()) + 1
    n, mean = len(x), float(x.mean())
    resid = x - mean
    se_ind = math.sqrt(float(resid @ resid) / (n * (n - 1))) if n > 1 else 0.0
    if groups < 2 and se_ind > 0:
        nan = math.nan
        return ClusteredMean(n, groups, mean, se_ind, nan, nan, nan, nan)
    sums = np.bincount(index, weights=resid, minlength=groups)
    se_cl = math.sqrt(groups / (groups - 1) * float(sums @ sums)) / n if groups > 1 else 0.0
    if se_cl == 0:
        return ClusteredMean(n, groups, mean, se_ind, se_cl, mean, mean, 1.0 if mean == 0.0 else 0.0)
    t = float(sps.t.ppf(1 - alpha / 2, groups - 1))
    p = float(2 * sps.t.sf(abs(mean / se_cl), groups - 1))
    return ClusteredMean(n, groups, mean, se_ind, se_cl, mean - t * se_cl, mean + t * se_cl, p)


def clustered_difference(
    baseline: Mapping[Hashable, bool],
    candidate: Mapping[Hashable, bool],
    cluster_of: Mapping[Hashable, Hashable],
    alpha: float = ALPHA,
) -> ClusteredMean:
    """Candidate minus baseline accuracy over paired items, clustered by shared context (at least
    two contexts)."""
    paired_counts(baseline, candidate, "clustered difference")  # same ids, not empty
    missing = [k for k in baseline if k not in cluster_of]
    if missing:
        raise StudyError(
            f"clusters: no cluster id for items {sorted(map(str, missing))[:5]} (first 5 shown); expected one per item"
        )
    ids = list(baseline)
    if len({repr(cluster_of[k]) for k in ids}) < 2:
        raise StudyError("clusters: all items share one cluster; a clustered error needs at least 2")
    diffs = [float(bool(candidate[k])) - float(bool(baseline[k])) for k in ids]
    return clustered_mean(diffs, [cluster_of[k] for k in ids], alpha)
