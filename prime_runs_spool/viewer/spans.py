"""Means, intervals and equal-width bins of finite numbers that stay finite.

The rows keep only finite numbers (``content.episodes.finite_number``), but a foreign
producer's reward of ``1e308`` and another of ``-1e308`` are finite while their difference,
their sum and a square are not: a bin's width became ``inf``, ``int(nan)`` raised, and the
run's page, its plots and the across-runs page of every run answered 500. Each figure here
is computed as before while it fits a float, and otherwise on the numbers halved or scaled
by a power of two (exact), so it is the same figure, rounded, whatever the numbers.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from prime_runs_spool.content.means import mean_of_sums, split_sums

_LARGEST = sys.float_info.max


def mean(values: Sequence[float]) -> float:
    """The mean of ``values`` (finite, at least one), finite as the run summary's is: both
    sum as ``content/means.py`` does."""
    return mean_of_sums(*split_sums(values))


def interval(values: Sequence[float], centre: float, z: float) -> tuple[float, float]:
    """``centre`` ± ``z`` standard errors of ``values``' mean (their sample standard deviation
    over the square root of their count), bounded to the floats: computed on the values
    scaled to below 1 in magnitude when the squares would overflow."""
    n = len(values)
    if n < 2:
        return centre, centre
    try:
        half = z * (sum((value - centre) ** 2 for value in values) / (n - 1)) ** 0.5 / n ** 0.5
    except OverflowError:
        half = math.inf
    if math.isfinite(half) and math.isfinite(centre - half) and math.isfinite(centre + half):
        return centre - half, centre + half
    scale = 2.0 ** -math.frexp(max(abs(value) for value in values))[1]  # a power of two: exact
    scaled = [value * scale for value in values]
    middle = centre * scale
    half = z * (sum((value - middle) ** 2 for value in scaled) / (n - 1)) ** 0.5 / n ** 0.5
    return max(-_LARGEST, (middle - half) / scale), min(_LARGEST, (middle + half) / scale)


class EqualBins:
    """``count`` equal-width bins from ``low`` to ``high`` (``low < high``, both finite):
    which one a value falls in, and where each starts. When ``high - low`` overflows, the
    bins are those of the halved numbers, their edges doubled back (halving is exact)."""

    def __init__(self, low: float, high: float, count: int) -> None:
        self.scale = 1.0 if math.isfinite(high - low) else 0.5
        self.low = low * self.scale
        self.count = count
        self.width = (high * self.scale - self.low) / count

    def index(self, value: float) -> int:
        return min(self.count - 1, int((value * self.scale - self.low) / self.width))

    def edge(self, i: int) -> float:
        """Where bin ``i`` starts (``count``: where the last one ends)."""
        return (self.low + i * self.width) / self.scale
