"""Let SQLite's driver thread have the GIL while the event loop is busy.

aiosqlite runs every statement in a thread of its own. That thread needs the GIL back after
each step of a statement and to hand its result over; CPython 3.11 starves it while the
event loop is busy: the loop lets go of the GIL for an instant at every ``select()`` and
takes it back before the waiting thread has woken, and each such wake-up restarts the
thread's wait (it asks the loop to drop the GIL only after a whole switch interval without
one). Measured against a loop busy in 2 ms steps: ``SELECT 1`` took 8-18 s, a 700-row
claim a minute (tests/bench/test_sqlite_handoff.py).

While a statement is in flight, each turn of the loop therefore sleeps :data:`PAUSE`
seconds with the GIL released, long enough for the thread to wake and take it; the same
statements then take milliseconds. Nothing sleeps while no statement is in flight.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

#: seconds the loop sleeps per turn while a statement is in flight (a thread's wake-up).
#: Linux rounds a sleep up by the timer slack (50 us): ``time.sleep(10e-6)`` took 85 us
#: here, ``50e-6`` 135 us, and the driver's thread took the GIL as surely in both
#: (tests/bench/test_sqlite_handoff.py: 700-row claim 85 ms, write 109 ms against the
#: busy loop, vs 85-155 ms and 113-134 ms). A saturated run paused 21,000 times a minute:
#: 1 s of the loop's time saved. ``os.sched_yield()`` instead starved the thread (16 s).
PAUSE = 10e-6


class GilHandoff:
    """An async context manager around SQLite statements (reentrant, counted)."""

    __slots__ = ("_active", "_handle", "_loop", "pauses")

    def __init__(self) -> None:
        self._active = 0
        self._handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: turns of the loop that paused (for tests and benchmarks)
        self.pauses = 0

    async def __aenter__(self) -> None:
        self._active += 1
        loop = asyncio.get_running_loop()
        if self._handle is None or loop is not self._loop:
            self._loop = loop
            self._handle = loop.call_soon(self._pause)

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._active -= 1

    @property
    def active(self) -> bool:
        return self._active > 0

    def _pause(self) -> None:
        if self._active <= 0:
            self._handle = None
            return
        time.sleep(PAUSE)  # the GIL released: the driver's thread takes it
        self.pauses += 1
        assert self._loop is not None
        self._handle = self._loop.call_soon(self._pause)
