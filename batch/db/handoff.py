"""Let SQLite's driver thread have the GIL while the event loop is busy.

SQLite's statements run in a thread: the store's transactions in one of this process
(:func:`batch.db.engine.run_transaction`), the rest in aiosqlite's. That thread needs the
GIL back after each step of a statement and to hand its result over; CPython 3.11 starves
it while the event loop is busy: the loop lets go of the GIL for an instant at every
``select()`` and takes it back before the waiting thread has woken, and each such wake-up
restarts the thread's wait (it asks the loop to drop the GIL only after a whole switch
interval without one). Measured against a loop busy in 2 ms steps: ``SELECT 1`` took
8-18 s, a 700-row claim a minute (tests/bench/test_sqlite_handoff.py).

While a statement is in flight, the interpreter's switch interval is therefore
:data:`SWITCH_INTERVAL` instead of 5 ms: a thread that has waited that long for the GIL
asks for it and gets it at the loop's next bytecode boundary, before the loop's turn ends,
so the same statements take milliseconds. The loop pays a thread switch only when the
driver's thread actually wants the GIL (a few times a statement), not a sleep every turn.
The interval is the process's: while no statement is in flight it is whatever it was.

It replaced a 10 us sleep in every turn of the loop while a statement was in flight (Linux
made each about 80 us: 460 a second in a saturated run, 3.6 % of its wall time). Measured
2026-12-06, each alternated with the sleep in one sitting: a saturated SQLite ``run_day``
made as many calls in its minute (161,000 against 164,000 on average over five rounds each,
runs of either swinging 138,000-179,000); 300 providers on SQLite (test_many_providers.py,
two runs against one) had their slices' p50 lateness 0.57-0.59 ms against 0.89-1.01 and
the same p99 (7.2-8.5 ms against 7.2-7.3); a 700-row claim against a loop busy in 2 ms steps
took 71 ms against 86, the 700 outcomes' write 91 against 107 (test_sqlite_handoff.py).
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

#: the switch interval (seconds) while a statement is in flight anywhere in the process
SWITCH_INTERVAL = 100e-6


class _Interval:
    """The process's one lowered switch interval, counted across every hand-off (of any
    thread's event loop: the count is under a lock)."""

    active = 0
    saved = 0.0
    lock = threading.Lock()

    @classmethod
    def enter(cls) -> None:
        with cls.lock:
            if cls.active == 0:
                cls.saved = sys.getswitchinterval()
                sys.setswitchinterval(min(cls.saved, SWITCH_INTERVAL))
            cls.active += 1

    @classmethod
    def leave(cls) -> None:
        with cls.lock:
            cls.active -= 1
            if cls.active == 0:
                sys.setswitchinterval(cls.saved)


class GilHandoff:
    """An async context manager around SQLite statements (reentrant, counted)."""

    __slots__ = ("_active", "entered")

    def __init__(self) -> None:
        self._active = 0
        #: statements that ran under it (for tests and benchmarks)
        self.entered = 0

    async def __aenter__(self) -> None:
        self._active += 1
        self.entered += 1
        _Interval.enter()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._active -= 1
        _Interval.leave()

    @property
    def active(self) -> bool:
        return self._active > 0
