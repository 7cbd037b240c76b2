"""A token bucket on an injected clock: a provider's calls-per-second capacity."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; :meth:`take` at monotonic ``now``.

    Time comes in as an argument, so a FakeClock that does not move refills nothing.
    """

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float) -> None:
        if not rate > 0:
            raise ValueError("rate must be positive")
        if not burst >= 1:
            raise ValueError("burst must be >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last: float | None = None

    def take(self, now: float) -> bool:
        """Spend one token if there is one; False means the call is over capacity."""
        last = self._last
        if last is not None and now > last:
            self._tokens = min(self.burst, self._tokens + (now - last) * self.rate)
        if last is None or now > last:
            self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def reset(self) -> None:
        self._tokens = self.burst
        self._last = None
