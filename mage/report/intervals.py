"""Confidence intervals of the report (95% unless said otherwise).

* :func:`wilson` for a rate: k successes in n independent trials. Evaluation plays one
  meta-episode per group by default, so its meta-episodes are independent draws.
* :func:`group_bootstrap` for a ratio of sums (a mean return, a rate, a difference of
  paired rates) when rows are not independent: whole groups are resampled with
  replacement, since the members of a group share an initial state. Percentile intervals,
  from a fixed seed, so a report is a pure function of its tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
BOOTSTRAP_RESAMPLES = 2000


def wilson(successes: float, trials: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of ``successes / trials``; None without trials.

    Args:
        successes: number of successes (0 <= successes <= trials).
        trials: number of trials.
        z: the normal quantile (1.96 for 95%).

    Returns:
        ``(low, high)`` within [0, 1].
    """
    if trials <= 0:
        return None
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def group_bootstrap(
    sums: Sequence[float] | np.ndarray,
    counts: Sequence[float] | np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``sum(sums) / sum(counts)`` over groups.

    Args:
        sums: per group, the sum of the values (returns, wins, paired differences).
        counts: per group, how many values the sum holds (> 0).
        resamples: bootstrap resamples of the groups.
        seed: the generator's seed (the same tables give the same interval).
        level: the interval's coverage.

    Returns:
        ``(low, high)``, or None without groups. One group gives its value twice.
    """
    sums, counts = np.asarray(sums, dtype=float), np.asarray(counts, dtype=float)
    if sums.shape != counts.shape:
        raise ValueError(f"sums and counts differ in shape: {sums.shape} vs {counts.shape}")
    if sums.size == 0:
        return None
    if (counts <= 0).any():
        raise ValueError("every group needs a positive count")
    rng = np.random.default_rng(seed)
    picks = rng.integers(sums.size, size=(resamples, sums.size))
    statistics = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(statistics, [tail, 100 - tail])
    return float(low), float(high)
