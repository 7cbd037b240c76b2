"""One clock object: monotonic seconds for intervals, a zone-aware wall clock for windows.

Everything that needs time takes a :class:`Clock`; nothing reads ``time`` ad hoc, so tests
drive a :class:`FakeClock` and never sleep.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol

#: Korea Standard Time. Korea keeps no daylight saving time, so a fixed offset is exact.
KST = timezone(timedelta(hours=9), "KST")


class Clock(Protocol):
    """What the product needs from time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for intervals and deadlines)."""
        ...

    def now(self) -> datetime:
        """The zone-aware wall-clock time (KST unless configured otherwise)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Wait until ``monotonic() >= deadline``."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` (the event loop's own clock) and ``datetime.now``."""

    __slots__ = ("tz",)

    def __init__(self, tz: timezone = KST) -> None:
        self.tz = tz

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(self.tz)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class FakeClock:
    """A clock for tests: it moves only when told, never backwards, and wakes sleepers.

    ``advance(dt)`` jumps ahead and resolves every sleeper whose deadline has passed;
    ``await run_for(dt)`` steps through the sleepers' deadlines one at a time, letting the
    woken tasks run between steps, so a 60 s timeout takes microseconds.
    """

    def __init__(self, start: datetime | None = None, *, monotonic: float = 0.0) -> None:
        if start is None:
            start = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
        if start.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._wall0 = start
        self._mono0 = monotonic
        self._mono = monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=self._mono - self._mono0)

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._mono + max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._mono:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Jump ahead by ``seconds`` (>= 0) and wake every sleeper now due."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        self._mono += seconds
        self._wake()

    def set_now(self, when: datetime) -> None:
        """Jump the wall clock forward to ``when`` (never backwards)."""
        delta = (when - self.now()).total_seconds()
        self.advance(delta)

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def next_deadline(self) -> float | None:
        """The earliest pending sleeper's deadline, if any."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def run_for(self, seconds: float, *, settle: int = 5) -> None:
        """Advance ``seconds`` step by step, letting woken tasks run at every deadline."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        end = self._mono + seconds
        await _settle(settle)
        while True:
            nxt = self.next_deadline
            if nxt is None or nxt > end:
                break
            self._mono = max(self._mono, nxt)
            self._wake()
            await _settle(settle)
        self._mono = end
        self._wake()
        await _settle(settle)


async def _settle(rounds: int) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
