"""One clock object: monotonic seconds for intervals, a zone-aware wall clock for windows.

Everything that needs time takes a :class:`Clock`; nothing reads ``time`` ad hoc, so tests
drive a :class:`FakeClock` and never sleep.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Protocol

from batch.deadlines import deadline, timeout

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

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        """Like ``asyncio.timeout``, on this clock: raises TimeoutError when it expires."""
        ...

    def deadline(self, seconds: float | None) -> Entered:
        """:meth:`timeout`'s block started now, without ``async with`` (a coroutine each
        way saved: the resilience chain takes one an attempt). Its ``leave()`` must follow
        in every case; it answers True when the block expired and the task's cancellation
        was its own (the caller turns that ``CancelledError`` into ``TimeoutError``)."""
        ...


class Entered(Protocol):
    """A timeout's block started by :meth:`Clock.deadline`."""

    def leave(self) -> bool:
        """End the block; True if its expiry cancelled the task (see Clock.deadline)."""
        ...


class SystemClock:
    """The real clock: the event loop's monotonic time and ``datetime.now``."""

    __slots__ = ("tz",)

    def __init__(self, tz: timezone = KST) -> None:
        self.tz = tz

    #: time.monotonic itself: a method around it was one more frame, several a refresh
    monotonic = staticmethod(time.monotonic)

    def now(self) -> datetime:
        return datetime.now(self.tz)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return timeout(seconds)

    #: batch.deadlines.deadline itself, as ``monotonic``: one frame less an attempt
    deadline = staticmethod(deadline)


class FakeClock:
    """A clock for tests: it moves only when told, never backwards, and wakes sleepers.

    ``advance(dt)`` jumps ahead and fires every timer whose deadline has passed;
    ``await run_for(dt)`` steps through the timers one deadline at a time, letting the woken
    tasks run between steps, so a 60 s timeout takes microseconds.
    """

    def __init__(self, start: datetime | None = None, *, monotonic: float = 0.0) -> None:
        if start is None:
            start = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
        if start.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._wall0 = start
        self._mono0 = monotonic
        self._mono = monotonic
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=self._mono - self._mono0)

    def call_at(self, deadline: float, callback: Callable[[], None]) -> _Timer:
        """Run ``callback`` once the clock reaches ``deadline``; ``.cancel()`` to drop it."""
        timer = _Timer(callback)
        heapq.heappush(self._timers, (deadline, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._mono + max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._mono:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_at(deadline, wake)
        try:
            await fut
        finally:
            timer.cancel()

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return _FakeTimeout(self, seconds)

    def deadline(self, seconds: float | None) -> Entered:
        return _FakeTimeout(self, seconds).enter()

    def advance(self, seconds: float) -> None:
        """Jump ahead by ``seconds`` (>= 0) and fire every timer now due."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        self._mono += seconds
        self._fire()

    def set_now(self, when: datetime) -> None:
        """Jump the wall clock forward to ``when`` (never backwards)."""
        self.advance((when - self.now()).total_seconds())

    def _fire(self) -> None:
        while self._timers and self._timers[0][0] <= self._mono:
            _, _, timer = heapq.heappop(self._timers)
            timer.fire()

    @property
    def next_deadline(self) -> float | None:
        """The earliest live timer's deadline, if any."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

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
            self._fire()
            await _settle(settle)
        self._mono = end
        self._fire()
        await _settle(settle)


class _Timer:
    __slots__ = ("_callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._callback()


class _FakeTimeout:
    """``asyncio.timeout`` semantics driven by a FakeClock."""

    __slots__ = ("_clock", "_fired", "_seconds", "_task", "_timer")

    def __init__(self, clock: FakeClock, seconds: float | None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._fired = False
        self._task: asyncio.Task[object] | None = None
        self._timer: _Timer | None = None

    def enter(self) -> _FakeTimeout:
        self._task = asyncio.current_task()
        if self._seconds is not None:
            self._timer = self._clock.call_at(self._clock.monotonic() + self._seconds,
                                              self._expire)
        return self

    def leave(self) -> bool:
        if self._timer is not None:
            self._timer.cancel()
        task = self._task
        if task is None:
            return False
        self._task = None
        return self._fired and task.uncancel() == 0

    async def __aenter__(self) -> None:
        self.enter()

    def _expire(self) -> None:
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self.leave() and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
        return None


async def _settle(rounds: int) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class ScaledClock:
    """Real time run ``speed`` times faster, from a shared anchor: demos and integration tests.

    Wall time is ``start + (time.time() - anchor) * speed``, so two processes given the same
    start, anchor and speed agree on what time it is (e.g. a ``run`` and a simulator in
    separate processes). Never used in production.
    """

    __slots__ = ("_anchor", "_speed", "_start", "_start_ts", "deadline", "monotonic", "tz")

    def __init__(self, speed: float, *, start: datetime, anchor: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._speed = speed
        self._start = start
        self._anchor = time.time() if anchor is None else anchor
        self._start_ts = start.timestamp()
        self.tz = start.tzinfo
        #: at speed 1 (the benchmarks' clock: real seconds, a shifted wall clock) the
        #: system's own, with no frame of ours around it
        self.monotonic: Callable[[], float] = (time.monotonic if speed == 1.0
                                              else self._scaled_monotonic)
        self.deadline: Callable[[float | None], Entered] = (deadline if speed == 1.0
                                                            else self._scaled_deadline)

    @property
    def speed(self) -> float:
        return self._speed

    def spec(self) -> str:
        """The ``MYDATA_CLOCK`` value that reproduces this clock in another process."""
        return f"speed={self._speed};start={self._start.isoformat()};anchor={self._anchor!r}"

    def _scaled_monotonic(self) -> float:
        return time.monotonic() * self._speed

    def now(self) -> datetime:
        # made in C from a timestamp: start + timedelta(...) cost 440 ns, this 300 (a run's
        # every outcome asks); exact to the microsecond (its float, 0.24 us apart in 2026)
        return datetime.fromtimestamp(
            self._start_ts + (time.time() - self._anchor) * self._speed, self.tz)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self._speed)

    async def sleep_until(self, deadline: float) -> None:
        delay = (deadline - self.monotonic()) / self._speed
        if delay > 0:
            await asyncio.sleep(delay)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return timeout(None if seconds is None else seconds / self._speed)

    def _scaled_deadline(self, seconds: float | None) -> Entered:
        return deadline(None if seconds is None else seconds / self._speed)


def clock_from_spec(spec: str | None) -> Clock:
    """``None``/empty: the system clock; else a :class:`ScaledClock` from ``MYDATA_CLOCK``.

    Spec: ``speed=20;start=2026-11-30T00:59:00+09:00[;anchor=<unix seconds>]``.
    """
    if not spec:
        return SystemClock()
    parts: dict[str, str] = {}
    for item in spec.split(";"):
        if "=" not in item:
            raise ValueError(f"MYDATA_CLOCK: {item!r} is not key=value")
        k, v = item.split("=", 1)
        parts[k.strip()] = v.strip()
    try:
        speed = float(parts.get("speed", "1"))
        start = datetime.fromisoformat(parts["start"]) if "start" in parts else datetime.now(KST)
        anchor = float(parts["anchor"]) if "anchor" in parts else None
    except (KeyError, ValueError) as exc:
        raise ValueError(f"MYDATA_CLOCK {spec!r}: {exc}") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=KST)
    return ScaledClock(speed, start=start, anchor=anchor)
