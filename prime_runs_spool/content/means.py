"""The mean of finite numbers, finite: summed so that no sum overflows.

A foreign producer's rewards and metrics may be any finite float: two rewards of ``1e308``
sum to ``inf``, and a run's ``avg_reward`` was infinite (sealed as null, shown live as
"inf") though the mean of finite numbers is finite. Numbers beyond :data:`BIG` in magnitude
are summed apart, scaled down by a power of two (exact), so neither sum can overflow for
any count a run holds; below it the sum and the mean are bit for bit what a plain sum over
the count gives. Kept here, under both the run summary (``summary``: running sums, added
inline on its hot path) and the viewer's figures (``viewer/spans.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: Numbers of this magnitude or more are summed apart, times :data:`SCALE`: below it, 2**64
#: of them sum to a finite float.
BIG = 2.0 ** 960
#: A power of two: multiplying by it is exact (a number beyond :data:`BIG` stays normal).
SCALE = 2.0 ** -64
_LARGEST = sys.float_info.max


def split_sums(values: Sequence[float]) -> tuple[float, float, int]:
    """``values``' sum below :data:`BIG` in magnitude, their scaled sum beyond it, and
    their count: what :func:`mean_of_sums` takes. Summed by the builtins when no value is
    big (a page's figures over a whole run's rows)."""
    if not values or (-BIG < min(values) and max(values) < BIG):
        return 0.0 + sum(values), 0.0, len(values)  # from 0.0, as the summary sums: -0.0 is 0.0
    small, big = 0.0, 0.0
    for value in values:
        if -BIG < value < BIG:
            small += value
        else:
            big += value * SCALE
    return small, big, len(values)


def mean_of_sums(small: float, big: float, count: int) -> float:
    """The mean of ``count`` finite numbers summed as :func:`split_sums` sums them (``count``
    at least 1): ``small / count`` when nothing was big, so the usual figure is unchanged;
    otherwise computed scaled down and clamped to the floats' range (the mean of finite
    numbers rounds to at most the largest float)."""
    if not big:
        return small / count
    return max(-_LARGEST, min(_LARGEST, (small * SCALE + big) / count / SCALE))
