"""Every statistical test and interval the study uses, and nothing else: no module outside this
package defines one. Pure functions of numbers, typed results, tested without a server.

- :mod:`~kvstudy.stats.binary`: right/wrong outcomes: Wilson and Clopper-Pearson intervals
  (statsmodels), exact McNemar (two-sided, one-sided, and vectorised over arrays of counts),
  Newcombe's paired interval of a difference, non-inferiority, Poisson-binomial chance.
- :mod:`~kvstudy.stats.binary_power`: exact power of the paired McNemar design, questions needed,
  and what published totals bound over every pairing.
- :mod:`~kvstudy.stats.clustered`: a mean with a cluster-robust standard error, interval and p.
- :mod:`~kvstudy.stats.permutation`: the exact permutation test on per-run values (within blocks
  or free), the smallest p a design can reach, runs needed, power of the blocked sign-flip test.
- :mod:`~kvstudy.stats.bootstrap`: two-level (runs, then requests) bootstrap of a ratio of run
  medians and of a line's intercept and slope.
- :mod:`~kvstudy.stats.family`: Holm's adjustment over one report's tests (statsmodels).

What no library has, and is therefore written here: Newcombe's paired interval (method 10), the
exact power of the exact McNemar test, a Poisson-binomial tail exact below 1e-16, the blocked
(stratified) exact permutation test and the power of its sign-flip form, two-level bootstraps,
and a clustered error that is exactly 0 when items agree.
"""
