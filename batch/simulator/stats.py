"""What one provider saw: calls by route, type and code, peaks, violations, latency.

Every update is O(1): peaks come from a ring of ten 100 ms buckets (the busiest 100 ms
bucket, and the busiest ten consecutive ones: a sliding second at 100 ms resolution), and
latency percentiles from a log-scaled histogram (about 5 % resolution).
"""

from __future__ import annotations

import math
from typing import Any

VIOLATIONS = ("rate", "window", "duplicate_tran_id", "second_transfer", "concurrency")
_LAT_MIN_MS = 0.01
_LAT_GROWTH = math.log(1.05)
_LAT_BUCKETS = 600  # 0.01 ms * 1.05**600 is far beyond any served latency
_RING = 10


def _bucket_of(ms: float) -> int:
    if ms <= _LAT_MIN_MS:
        return 0
    return min(_LAT_BUCKETS - 1, int(math.log(ms / _LAT_MIN_MS) / _LAT_GROWTH) + 1)


def _bucket_value(i: int) -> float:
    """The upper edge of histogram bucket ``i`` in ms."""
    return _LAT_MIN_MS * math.exp(_LAT_GROWTH * i)


class ProviderStats:
    """Counters for one provider (or the fleet total); :meth:`snapshot` is the JSON shape."""

    __slots__ = (
        "_bucket",
        "_hist",
        "_ring",
        "_ring_sum",
        "by_api_type",
        "by_code",
        "by_route",
        "calls",
        "in_flight",
        "latency_max",
        "peak_1s",
        "peak_100ms",
        "peak_concurrency",
        "transfers",
        "violations",
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.by_route: dict[str, int] = {}
        self.by_api_type: dict[str, int] = {}
        self.by_code: dict[str, int] = {}
        self.violations: dict[str, int] = dict.fromkeys(VIOLATIONS, 0)
        self.transfers = 0
        self.peak_1s = 0
        self.peak_100ms = 0
        self.peak_concurrency = 0
        self.latency_max = 0.0
        self._hist = [0] * _LAT_BUCKETS
        self._ring = [0] * _RING
        self._ring_sum = 0
        self._bucket: int | None = None
        # in_flight survives a reset: those calls are still being served
        if not hasattr(self, "in_flight"):
            self.in_flight = 0

    def begin(self, now: float, route: str, api_type: str) -> None:
        """A call arrived at monotonic second ``now``."""
        self.calls += 1
        self.by_route[route] = self.by_route.get(route, 0) + 1
        self.by_api_type[api_type] = self.by_api_type.get(api_type, 0) + 1
        self.in_flight += 1
        if self.in_flight > self.peak_concurrency:
            self.peak_concurrency = self.in_flight
        b = int(now * 10)
        ring = self._ring
        last = self._bucket
        if last is None or b - last >= _RING:
            for i in range(_RING):
                ring[i] = 0
            self._ring_sum = 0
        elif b > last:
            for k in range(last + 1, b + 1):
                idx = k % _RING
                self._ring_sum -= ring[idx]
                ring[idx] = 0
        cur = b if last is None or b > last else last
        self._bucket = cur
        idx = cur % _RING
        ring[idx] += 1
        self._ring_sum += 1
        if ring[idx] > self.peak_100ms:
            self.peak_100ms = ring[idx]
        if self._ring_sum > self.peak_1s:
            self.peak_1s = self._ring_sum

    def end(self, code: str, latency_ms: float) -> None:
        """The call was answered with ``code`` ("reset" for a dropped connection)."""
        self.in_flight -= 1
        self.by_code[code] = self.by_code.get(code, 0) + 1
        self._hist[_bucket_of(latency_ms)] += 1
        if latency_ms > self.latency_max:
            self.latency_max = latency_ms

    def violation(self, kind: str) -> None:
        self.violations[kind] += 1

    def percentile(self, q: float) -> float:
        """The latency (ms) below which a fraction ``q`` of answered calls fell."""
        total = sum(self._hist)
        if total == 0:
            return 0.0
        rank = q * total
        seen = 0
        for i, n in enumerate(self._hist):
            seen += n
            if seen >= rank and n:
                return min(_bucket_value(i), self.latency_max)
        return self.latency_max

    def snapshot(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "by_route": dict(self.by_route),
            "by_api_type": dict(self.by_api_type),
            "by_code": dict(self.by_code),
            "peak_1s": self.peak_1s,
            "peak_100ms": self.peak_100ms,
            "peak_concurrency": self.peak_concurrency,
            "violations": dict(self.violations),
            "latency_ms": {
                "p50": round(self.percentile(0.50), 3),
                "p90": round(self.percentile(0.90), 3),
                "p99": round(self.percentile(0.99), 3),
                "max": round(self.latency_max, 3),
            },
            "transfers": self.transfers,
        }
