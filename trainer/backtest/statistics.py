"""The paired statistics of a backtest: the two-level bootstrap of candidate minus control over seeds x dev items,
the training-seed spread a one-seed backtest adds, the minimum detectable effect, and the sequential rule that
decides when to stop adding seeds.
"""

from __future__ import annotations

import numpy as np

Z_POWER = 1.959964 + 0.841621  # two-sided 5% test, 80% power: MDE = (z_0.975 + z_0.8) x SE


def paired_bootstrap(diffs: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float, float]:
    """Mean paired difference over (seeds x items) and its bootstrap 95% interval and standard error.

    Two-level resampling: seeds with replacement, then items with replacement within each drawn seed, so the
    interval carries both the dev sampling error and the seed-to-seed spread of training.
    """
    diffs = np.asarray(diffs, dtype=float)
    n_seeds, n_items = diffs.shape
    rng = np.random.default_rng(seed)
    pick_seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    means = np.empty(n_boot)
    for b in range(n_boot):
        items = rng.integers(0, n_items, size=(n_seeds, n_items))
        means[b] = diffs[pick_seeds[b][:, None], items].mean()
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(diffs.mean()), float(lo), float(hi), float(means.std(ddof=1))


def with_seed_spread(delta: float, lo: float, hi: float, se: float, n_seeds: int, seed_sd: float
                     ) -> tuple[float, float, float]:
    """The interval and error of a backtest with its training-seed spread: one seed's bootstrap resamples its items
    only, so the between-seed spread `seed_sd` (measured elsewhere) is added in quadrature and the interval is the
    normal one around the estimate; from two seeds on, the two-level bootstrap sees the spread itself."""
    if n_seeds > 1 or seed_sd <= 0:
        return lo, hi, se
    se = float(np.hypot(se, seed_sd))
    return delta - 1.959964 * se, delta + 1.959964 * se, se


def decide(delta: float, lo: float, hi: float, n_seeds: int, max_seeds: int, failed_gates: list[str]) -> str:
    """The sequential rule after a round: why to stop, or '' to extend by one seed.

    A failed gate stops at once; an interval above or below zero is decided; a non-positive estimate is not
    worth more budget; a positive one whose interval straddles zero is extended until `max_seeds`.
    """
    if failed_gates:
        return "gate"
    if lo > 0:
        return "significant"
    if hi < 0:
        return "worse"
    if delta <= 0:
        return "no_gain"
    return "budget" if n_seeds >= max_seeds else ""
