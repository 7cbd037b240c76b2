"""Sliding windows with O(1) bookkeeping: the last N calls, or the last N seconds.

Both keep running totals, so reading a rate never walks the window. The time window holds
one bucket per second; moving to a new second clears only the buckets that fell out.
"""

from __future__ import annotations

FAILED = 1
SLOW = 2


class CountWindow:
    """The last ``size`` recorded calls: how many failed, how many were slow."""

    __slots__ = ("_codes", "_i", "failures", "size", "slow", "total")

    def __init__(self, size: int) -> None:
        self.size = size
        self._codes = bytearray(size)
        self._i = 0
        self.total = 0
        self.failures = 0
        self.slow = 0

    def add(self, code: int, now: float) -> None:
        """Record one call (``code`` = FAILED | SLOW bits); the oldest falls out when full."""
        i = self._i
        if self.total == self.size:
            old = self._codes[i]
            self.failures -= old & FAILED
            self.slow -= old >> 1
        else:
            self.total += 1
        self._codes[i] = code
        self.failures += code & FAILED
        self.slow += code >> 1
        i += 1
        self._i = 0 if i == self.size else i

    def add_ok(self, now: float) -> None:
        """``add(0, now)``: a quick success, nothing to count but the call."""
        self.add(0, now)

    def expire(self, now: float) -> None:
        """Nothing ages out of a count window."""

    def clear(self) -> None:
        self._codes = bytearray(self.size)
        self._i = self.total = self.failures = self.slow = 0


class TimeWindow:
    """The calls of the last ``size`` whole seconds, ``(now_s - size, now_s]``, by bucket."""

    __slots__ = ("_bfail", "_bslow", "_btotal", "_head", "failures", "size", "slow", "total")

    def __init__(self, size: int) -> None:
        self.size = size
        self._btotal = [0] * size
        self._bfail = [0] * size
        self._bslow = [0] * size
        self._head = -1  # the latest second the buckets are current for
        self.total = 0
        self.failures = 0
        self.slow = 0

    def expire(self, now: float) -> None:
        """Drop the buckets that fell out of the window by second ``int(now)``."""
        sec = int(now)
        head = self._head
        if sec <= head:
            return
        size = self.size
        if sec - head >= size:
            if self.total:
                self.clear()
        else:
            bt, bf, bs = self._btotal, self._bfail, self._bslow
            for s in range(head + 1, sec + 1):
                j = s % size
                if bt[j]:
                    self.total -= bt[j]
                    self.failures -= bf[j]
                    self.slow -= bs[j]
                    bt[j] = bf[j] = bs[j] = 0
        self._head = sec

    def add(self, code: int, now: float) -> None:
        if int(now) > self._head:  # a new second (expire's own test: a frame saved a call)
            self.expire(now)
        j = self._head % self.size
        self._btotal[j] += 1
        self.total += 1
        f = code & FAILED
        s = code >> 1
        self._bfail[j] += f
        self.failures += f
        self._bslow[j] += s
        self.slow += s

    def add_ok(self, now: float) -> None:
        """``add(0, now)``: a quick success (a healthy provider's every call) moves only
        the totals."""
        if int(now) > self._head:
            self.expire(now)
        self._btotal[self._head % self.size] += 1
        self.total += 1

    def clear(self) -> None:
        size = self.size
        self._btotal = [0] * size
        self._bfail = [0] * size
        self._bslow = [0] * size
        self.total = self.failures = self.slow = 0


class Counter2:
    """Two counts (e.g. calls and retries) over the last ``size`` seconds, by bucket."""

    __slots__ = ("_a", "_b", "_head", "a", "b", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._a = [0] * size
        self._b = [0] * size
        self._head = -1
        self.a = 0
        self.b = 0

    def expire(self, now: float) -> None:
        sec = int(now)
        head = self._head
        if sec <= head:
            return
        size = self.size
        if sec - head >= size:
            self._a = [0] * size
            self._b = [0] * size
            self.a = self.b = 0
        else:
            ba, bb = self._a, self._b
            for s in range(head + 1, sec + 1):
                j = s % size
                self.a -= ba[j]
                self.b -= bb[j]
                ba[j] = bb[j] = 0
        self._head = sec

    def add_a(self, now: float) -> None:
        if int(now) != self._head:
            self.expire(now)
        self._a[self._head % self.size] += 1
        self.a += 1

    def add_b(self, now: float) -> None:
        if int(now) != self._head:
            self.expire(now)
        self._b[self._head % self.size] += 1
        self.b += 1
