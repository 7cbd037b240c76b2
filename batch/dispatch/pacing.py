"""Pure pacing arithmetic: a minute's target from the plan and what is left, and its slices."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

SLICES_PER_MINUTE = 600
SLICE_SECONDS = 60.0 / SLICES_PER_MINUTE
#: (sqrt(5) - 1) / 2: the multiples of it, taken modulo 1, fill [0, 1) the most evenly
_GOLDEN = (5 ** 0.5 - 1) / 2


def slice_offset(index: int) -> float:
    """Where the ``index``-th provider's ticks sit in each slice, as a fraction of it in [0, 1).

    frac(index * golden ratio): any run of consecutive indices lands spread over the whole
    slice, the gaps between neighbours of at most three sizes. The run gives the i-th of N
    providers the period phase i/N (``slice_counts``), so providers with the same rate that
    start in the same slices are neighbours by index, and their ticks must not bunch there.
    A hash of the org code (the offsets before) left clusters: at 300 providers x 2 starts/s,
    433 of the 3,000 ticks in 5 s were under 0.3 ms after the one before and up to 7 fell
    in 3 ms, against a least gap of 0.81 ms and at most 3 in 3 ms now. In one
    run with the hash, the six providers of the densest cluster (ticks 44-48 ms into the
    same slices) had a median lateness of 2.4-3.2 ms against 0.5 ms for most; one-minute
    runs alternated after the change (worst provider's median 1.41-1.80 ms against
    1.58-1.88) are within the machine's noise (tests/bench/test_many_providers.py).
    """
    if index < 0:
        raise ValueError("index must be >= 0")
    return (index * _GOLDEN) % 1.0


def slice_counts(n: int, slices: int = SLICES_PER_MINUTE, phase: float = 0.0) -> list[int]:
    """``n`` starts spread over ``slices`` slices, carrying the fraction: sums to exactly n.

    Slice k gets floor(((k+1)n + c)/s) - floor((kn + c)/s): never more than ceil(n/s), never
    bursty. ``phase`` (in [0, 1)) is where the carried fraction starts, c = floor(phase * s):
    it moves which slices get the starts when n/s is not whole (at 2 refreshes/s, one slice
    in five), never how many the slices add up to (floor(c/s) = 0, so still exactly n).
    """
    if n < 0 or slices <= 0:
        raise ValueError("n must be >= 0 and slices > 0")
    if not 0.0 <= phase < 1.0:
        raise ValueError("phase must be in [0, 1)")
    c = int(phase * slices)
    return [((k + 1) * n + c) // slices - (k * n + c) // slices for k in range(slices)]


def minute_target(
    minute: int,
    remaining_minutes: Sequence[int],
    planned: Mapping[int, int],
    remaining_quota: int,
    cap: int,
) -> int:
    """How many refreshes to start in ``minute``, the first of ``remaining_minutes``.

    What is left of the day's quota is re-spread over the remaining minutes in proportion to
    their planned targets (evenly if none are planned), so a short minute is made up later;
    the last minute takes all that is left. Never above ``cap``.
    """
    if remaining_quota <= 0 or not remaining_minutes:
        return 0
    if len(remaining_minutes) == 1:
        return min(cap, remaining_quota)
    weights = [max(0, planned.get(m, 0)) for m in remaining_minutes]
    total = sum(weights)
    if total == 0:
        share = remaining_quota / len(remaining_minutes)
    else:
        share = remaining_quota * max(0, planned.get(minute, 0)) / total
    return max(0, min(cap, remaining_quota, int(share + 0.5)))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, nearest rank; 0.0 if empty."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return float(sorted_values[rank])
