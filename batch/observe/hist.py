"""A histogram in plain ints: cumulative at collection time, one bisect on the hot path."""

from __future__ import annotations

from bisect import bisect_left as _bisect
from collections.abc import Sequence

#: seconds: 5 ms .. 30 s, the range of one MyData call (timeouts end near 10-23 s)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: seconds a 100 ms slice started late
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: attempts per logical call
ATTEMPT_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0)


class Hist:
    """Counts per bucket (non-cumulative), the sum, and the last exemplar per bucket."""

    __slots__ = ("bounds", "counts", "exemplars", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        #: per bucket, the last (trace id, value) observed there, or None
        self.exemplars: list[tuple[str, float] | None] = [None] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, exemplar: str | None = None) -> None:
        i = _bisect(self.bounds, value)
        self.counts[i] += 1
        self.total += value
        if exemplar is not None:
            self.exemplars[i] = (exemplar, value)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int, tuple[str, float] | None]]:
        """(le, cumulative count, exemplar) per bucket, ``+Inf`` last."""
        out = []
        running = 0
        for i, n in enumerate(self.counts):
            running += n
            le = "+Inf" if i == len(self.bounds) else _le(self.bounds[i])
            out.append((le, running, self.exemplars[i]))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))
