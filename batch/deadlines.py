"""Timeouts for thousands of calls a second, on one timer per event loop.

``asyncio.timeout`` gives every use its own ``TimerHandle`` (a copy of the context and a
heap entry in the loop) and a ``Timeout`` object with a state machine: on a saturated run
each HTTP attempt's timeout cost more of the client's CPU than the breaker, the limiter and
the bulkhead together (tests/bench/profile_dispatch.py). Here a timeout is a small entry in
a queue: entries made with the same duration arrive in deadline order, so each duration has
a FIFO (the HTTP attempts' per-attempt timeout, the bulkhead's wait) and one loop timer is
armed at the earliest live deadline of all of them. An attempt that ends long before its
deadline (nearly all) leaves a dead entry that the timer drops when it reaches it.

The semantics are ``asyncio.timeout``'s: on expiry the task is cancelled; leaving the block
turns that cancellation, and only that one, into ``TimeoutError`` (a cancellation from
elsewhere still propagates). :class:`batch.clock.SystemClock` and ``ScaledClock`` hand these
out; the ``FakeClock`` of the tests keeps its own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType
from weakref import WeakKeyDictionary

_current_task = asyncio.current_task
_CancelledError = asyncio.CancelledError


class Deadline:
    """One ``async with`` block's timeout (single use)."""

    __slots__ = ("_cancelling", "_expired", "_queue", "task", "when")

    def __init__(self, queue: Deadlines | None, when: float) -> None:
        self._queue = queue  # None: no deadline at all
        self.when = when  # the loop's time
        self.task: asyncio.Task[object] | None = None  # set while the block runs
        self._expired = False
        self._cancelling = 0

    async def __aenter__(self) -> Deadline:
        queue = self._queue
        if queue is not None:
            task = _current_task()
            if task is None:
                raise RuntimeError("a timeout must be used inside a task")
            self.task = task
            self._cancelling = task.cancelling()
            queue.add(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        task = self.task
        self.task = None  # a dead entry from now on: the timer skips it
        if (self._expired and task is not None and task.uncancel() <= self._cancelling
                and exc_type is _CancelledError):
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        return self._expired

    def expire(self) -> None:
        task = self.task
        if task is not None and not task.done():
            self._expired = True
            task.cancel()


class Deadlines:
    """The timeouts of one event loop: a FIFO per duration, one timer at the earliest."""

    __slots__ = ("_armed", "_handle", "_loop", "_queues")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queues: dict[float, deque[Deadline]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed = float("inf")

    def timeout(self, seconds: float | None) -> Deadline:
        """A timeout of ``seconds`` from now (None: none at all)."""
        if seconds is None:
            return Deadline(None, 0.0)
        return Deadline(self, self._loop.time() + seconds)

    def add(self, d: Deadline) -> None:
        # Deadlines made with the same duration come in order; a block entered later than
        # its timeout was made (rare) may sit behind a later one: it fires when that does,
        # at worst, and never early.
        key = round(d.when - self._loop.time(), 3)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = deque()
        q.append(d)
        if d.when < self._armed:
            self._arm(d.when)

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed = float("inf")
        now = self._loop.time()
        earliest = float("inf")
        for key, q in list(self._queues.items()):
            while q:
                d = q[0]
                if d.task is None:  # ended before its deadline
                    q.popleft()
                elif d.when <= now:
                    q.popleft()
                    d.expire()
                else:
                    earliest = min(earliest, d.when)
                    break
            if not q:
                del self._queues[key]
        if earliest < float("inf"):
            self._arm(earliest)

    @property
    def pending(self) -> int:
        """Entries held (live and dead), for tests."""
        return sum(len(q) for q in self._queues.values())


_by_loop: WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = WeakKeyDictionary()
#: the last loop asked about and its queue (a weak mapping's lookup costs a weak reference)
_last: tuple[asyncio.AbstractEventLoop | None, Deadlines | None] = (None, None)
_get_running_loop = asyncio.get_running_loop


def deadlines() -> Deadlines:
    """The running loop's :class:`Deadlines`."""
    global _last
    loop = _get_running_loop()
    last_loop, d = _last
    if loop is last_loop and d is not None:
        return d
    d = _by_loop.get(loop)
    if d is None:
        d = _by_loop[loop] = Deadlines(loop)
    _last = (loop, d)
    return d
