"""The speed experiment: the sweep grid, the runner, the verdict on TPOT and the analysis."""
