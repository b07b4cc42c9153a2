"""The paired statistics of a backtest: the two-level bootstrap of candidate minus control over seeds x dev items,
the training-seed spread a one-seed backtest adds, the error few items can claim at least, the minimum detectable
effect, and the sequential rule that decides when to stop adding seeds.
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


def resolution_se(n_items: int) -> float:
    """The smallest standard error `n_items` paired items can claim. Where both arms agree on every item the
    bootstrap's error is 0 (and the interval a point), yet a discordance rate up to 3/n is not excluded at 95% (the
    rule of three); the mean difference of n items with that discordance has a standard error of sqrt(3)/n."""
    return float(np.sqrt(3.0) / max(n_items, 1))


def with_seed_spread(delta: float, lo: float, hi: float, se: float, n_seeds: int, seed_sd: float
                     ) -> tuple[float, float, float, bool]:
    """The interval and error of a backtest with its training-seed spread, and whether they are estimable.

    One seed's bootstrap resamples its items only: the between-seed spread `seed_sd` (measured elsewhere,
    `benchmarks/seed_spread.py`) is added in quadrature and the interval is the normal one around the estimate;
    with no such spread configured one seed estimates nothing, and the interval is the whole range [-1, +1] of an
    accuracy difference (not estimable). From two seeds on, the two-level bootstrap sees the spread itself."""
    if n_seeds == 1 and seed_sd <= 0:
        return -1.0, 1.0, 1.0, False
    if n_seeds > 1:
        return lo, hi, se, True
    se = float(np.hypot(se, seed_sd))
    return delta - 1.959964 * se, delta + 1.959964 * se, se, True


def backtest_interval(diffs: np.ndarray, n_boot: int, seed_sd: float) -> tuple[float, float, float, float, bool]:
    """What a backtest reports of its paired differences (seeds x items): the mean, its 95% interval, its standard
    error (at least `resolution_se` of the items), and whether they are estimable (see `with_seed_spread`)."""
    delta, lo, hi, se = paired_bootstrap(diffs, n_boot)
    floor = resolution_se(np.shape(diffs)[1])
    if se < floor:  # the arms agree on (almost) every item: not a certainty, too few items to see a difference
        lo, hi, se = min(lo, delta - 1.959964 * floor), max(hi, delta + 1.959964 * floor), floor
    lo, hi, se, estimable = with_seed_spread(delta, lo, hi, se, len(diffs), seed_sd)
    return delta, lo, hi, se, estimable


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
