"""A worker's stock of shared permits for one provider (the limiter's SharedPermits).

The cluster-wide GCRA lives in Redis (batch/cluster/scripts.py); asking it per call would
cost a round trip per call, so each worker reserves a small batch per slice: slots within
the next ``horizon`` seconds, as many as its recent demand needs. Calls take them in order;
a slot left unused for longer than ``stale_after`` (a quarter of the interval) is dropped
(the cluster lost that much of the provider's rate, never more than it may send), and a call
that reaches its slot too late gives it up too (RateLimiter.late). Permits from different
round trips are placed on one steady estimate of the server's clock (ServerClock). With no
permit in stock a call is not sent: it waits for the next refill (batch/resilience/chain.py's
PERMIT_WAIT) and is refused if none comes (nothing reserved, the consent stays due):
strict, never borrowed.

Pure and clock-driven: the session's refill loop does the Redis round trip.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from batch.clock import Clock
from batch.resilience.limiter import LATE_MIN, LATE_SHARE

#: seconds between the slices a worker reserves for (the dispatcher's slice)
SLICE = 0.1


class PermitStock:
    """Shared permits in hand for one provider, and how many to ask for next."""

    __slots__ = ("_demand", "_last_seen", "_misses", "_refill", "_slots", "_taken",
                 "_throttled", "burst", "factor", "horizon", "org_code", "rate", "refused",
                 "stale_after", "waited")

    def __init__(self, org_code: str, *, rate: float, burst: int, horizon: float = 0.3,
                 stale_after: float | None = None) -> None:
        if stale_after is None:  # half as late as the limiter lets a call be sent
            stale_after = max(LATE_MIN, LATE_SHARE / rate) / 2 if rate > 0 else 0.0
        if rate <= 0 or burst < 1 or horizon <= 0 or stale_after < 0:
            raise ValueError("bad permit stock settings")
        self.org_code = org_code
        self.rate = rate
        self.burst = burst
        self.horizon = horizon
        self.stale_after = stale_after
        self._slots: deque[float] = deque()
        self._taken = 0  # calls since the last ask
        self._misses = 0
        self._demand = 0.0  # calls per second, smoothed
        self._last_seen: float | None = None
        self._throttled = False
        self.refused = 0  # calls refused for want of a permit (the summary's count)
        self.waited = 0  # calls that found the stock empty and waited for a refill
        self._refill: asyncio.Event | None = None
        self.factor = 1.0  # the cluster-wide back-off last reported by the server

    # ------------------------------------------------------------------ the limiter's side
    def take(self, now: float) -> float | None:
        slots = self._slots
        while slots and slots[0] < now - self.stale_after:
            slots.popleft()
        if not slots:
            self._misses += 1
            return None
        self._taken += 1
        return slots.popleft()

    async def refilled(self, clock: Clock, seconds: float) -> bool:
        """Wait up to ``seconds`` for the next :meth:`add`; False (one refusal) if none."""
        self.waited += 1
        ev = self._refill
        if ev is None:
            ev = self._refill = asyncio.Event()
        ev.clear()
        try:
            async with clock.timeout(seconds):
                await ev.wait()
        except TimeoutError:
            self.refused += 1
            return False
        # Slots already past when they arrived (a late refill) are not for waiting calls:
        # several waiters sending at once on past slots would bunch above the rate.
        now = clock.monotonic()
        slots = self._slots
        while slots and slots[0] < now:
            slots.popleft()
        return True

    def throttled(self, now: float) -> None:
        self._throttled = True

    # ------------------------------------------------------------------ the refill side
    def want(self, now: float, live: int = 1) -> int:
        """How many permits to ask for now, less what is still in stock: this worker's share
        of the shared rate over the horizon (the rate in force divided by the ``live``
        workers), or more if its demand (calls taken and refused since the last ask,
        smoothed) needs more; never more than the whole horizon holds."""
        if self._last_seen is not None and now > self._last_seen:
            per_s = (self._taken + 2 * self._misses) / (now - self._last_seen)
            self._demand = 0.5 * self._demand + 0.5 * per_s
        self._last_seen = now
        self._taken = self._misses = 0
        left = sum(1 for s in self._slots if s >= now - self.stale_after)
        share = self.rate * self.factor / max(1, live)
        need = max(math.ceil(self._demand * self.horizon * 1.5) + 1,
                   math.ceil(share * self.horizon * 1.2))
        cap = math.ceil(self.rate * self.horizon) + self.burst
        return max(0, min(need, cap) - left)

    def add(self, offsets: tuple[float, ...], at: float, factor: float = 1.0) -> None:
        """Permits granted by the server: ``at`` is the local monotonic time its offsets
        count from; ``factor`` the shared back-off in force (1.0: none)."""
        self._slots.extend(at + o for o in offsets)
        self.factor = factor
        if offsets and self._refill is not None:
            self._refill.set()

    def pop_throttled(self) -> bool:
        t, self._throttled = self._throttled, False
        return t

    def clear(self) -> None:
        """Drop the stock (the shared limit is given up): waiting calls look again."""
        self._slots.clear()
        if self._refill is not None:
            self._refill.set()

    @property
    def stock(self) -> int:
        return len(self._slots)


class ServerClock:
    """The Redis server's clock (the scripts' time base) mapped onto this worker's monotonic
    clock, so that permits granted in different round trips keep their spacing here.

    Each round trip is a sample: the server read its time somewhere between ``sent`` and
    ``recv`` (local), so ``server - local`` lies within [server - recv, server - sent].
    Anchoring each batch at its own round trip's midpoint would shift a whole batch by up to
    half that round trip: a slow one (a stall, a busy Redis) followed by a fast one bunches
    the calls at the seam, above the rate. The offset used instead is the midpoint of the
    fastest round trip within the last ``window`` seconds (Cristian's method with a minimum
    filter): it changes only by a fraction of the fastest round trip. A sample whose bounds
    cannot meet those of the offset in use means a clock was stepped: the estimate restarts
    from it. The window is short enough that two clocks' drift within it is negligible.
    """

    __slots__ = ("_best", "window")

    def __init__(self, window: float = 10.0) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        #: (recv, rtt, offset), rtt increasing from the front: the front is the window's best
        self._best: deque[tuple[float, float, float]] = deque()

    def sample(self, sent: float, recv: float, server_now: float) -> float:
        """Record one round trip; returns the offset (server minus local) now in force."""
        rtt = max(0.0, recv - sent)
        offset = server_now - (sent + recv) / 2
        best = self._best
        if best:
            _, r0, o0 = best[0]
            if server_now - recv > o0 + r0 / 2 or server_now - sent < o0 - r0 / 2:
                best.clear()  # the offset in use is impossible now: a clock stepped
        while best and best[-1][1] >= rtt:
            best.pop()
        best.append((recv, rtt, offset))
        while best[0][0] < recv - self.window:
            best.popleft()
        return best[0][2]

    @property
    def rtt(self) -> float | None:
        """The fastest round trip in the window (the offset's uncertainty is half of it)."""
        return self._best[0][1] if self._best else None

    def to_local(self, server_t: float) -> float:
        """A time on the server's clock, on this worker's (by the offset in force)."""
        best = self._best
        if not best:
            raise RuntimeError("no sample yet")
        return server_t - best[0][2]
