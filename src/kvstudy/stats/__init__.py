"""Every statistical test and interval the study uses, and nothing else: no module outside this
package defines one. Pure functions of numbers with typed results: :mod:`~kvstudy.stats.binary`
(right/wrong outcomes, clustered means, Holm), :mod:`~kvstudy.stats.binary_power` (power, bounds
from totals), :mod:`~kvstudy.stats.permutation` (per-run values: permutation tests, drift, two-level bootstraps).

Libraries do what they can: Wilson and Clopper-Pearson (statsmodels' ``proportion_confint``), the
exact McNemar p (scipy's binomial), Holm (``multipletests``), Newcombe's unpaired interval
(``confint_proportions_2indep``), t and normal quantiles (scipy). Written here because no library
has them: Newcombe's paired interval (method 10), the exact power of the exact McNemar test, a
Poisson-binomial tail exact below 1e-16, the blocked (stratified) exact permutation test and the
power of its sign-flip form, two-level bootstraps, and a clustered error that is exactly 0 when
items agree.
"""
