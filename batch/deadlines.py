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
import time
from asyncio import tasks as _tasks
from collections import deque
from collections.abc import Callable
from threading import get_ident
from types import TracebackType
from weakref import WeakKeyDictionary

_current_task = asyncio.current_task
_base_time = asyncio.BaseEventLoop.time
#: the task each running loop is running (what ``asyncio.current_task`` reads)
_running: dict[asyncio.AbstractEventLoop, asyncio.Task[object]] = (
    _tasks._current_tasks)  # type: ignore[attr-defined]  # asyncio's own, not typeshed's
_running_task = _running.get
_CancelledError = asyncio.CancelledError


class Deadline:
    """One ``async with`` block's timeout of ``seconds`` from its start (single use; None:
    no deadline at all). It joins its loop's :class:`Deadlines` as the block starts."""

    __slots__ = ("_cancelling", "_expired", "_fifo", "_queue", "seconds", "task", "when")

    def __init__(self, seconds: float | None, queue: Deadlines | None = None) -> None:
        self.seconds = seconds
        self._queue = queue  # None: the running loop's
        self.when = 0.0  # the loop's time, set as the block starts
        self.task: asyncio.Task[object] | None = None  # set while the block runs
        self._expired = False
        self._cancelling = 0
        self._fifo: deque[Deadline] | None = None  # the queue's FIFO it waits in

    def enter(self) -> Deadline:
        """Start the block now (what ``async with`` does first, without its coroutine: the
        resilience chain's attempts take one each); :meth:`leave` must follow, in every
        case."""
        seconds = self.seconds
        if seconds is not None:
            given = self._queue
            queue = given if given is not None else _last[1]
            # The loop's running task read straight from asyncio's table when the queue's
            # loop is the one running in this thread: ``asyncio.current_task`` asks for the
            # running loop, which in Python 3.11 makes a getpid system call each time.
            task = (_running_task(queue._loop) if queue is not None
                    and getattr(queue._loop, "_thread_id", None) == get_ident() else None)
            if task is None:
                task = _current_task()
                if task is None:
                    raise RuntimeError("a timeout must be used inside a task")
                if given is None:
                    queue = _of_loop(task.get_loop())
            assert queue is not None
            self._queue = queue
            self.task = task
            self._cancelling = task.cancelling()
            queue.add(self, seconds)
        return self

    def leave(self) -> bool:
        """End the block (again: nothing). True if it expired and the task's cancellation
        was this timeout's alone: the caller turns a ``CancelledError`` then into
        ``TimeoutError``, as ``async with`` does."""
        task = self.task
        if task is None:
            return False
        self.task = None  # a dead entry from now on: the timer skips it
        fifo = self._fifo
        if fifo and fifo[0] is self:
            # The oldest of its duration (calls of one duration end roughly in order): it
            # and the dead entries behind it go now, so a FIFO holds about what is in flight.
            fifo.popleft()
            while fifo and fifo[0].task is None:
                fifo.popleft()
        return self._expired and task.uncancel() <= self._cancelling

    async def __aenter__(self) -> Deadline:
        return self.enter()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.leave() and exc_type is _CancelledError:
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

    __slots__ = ("_armed", "_handle", "_loop", "_now", "_queues")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: the loop's clock: asyncio's own loops keep time.monotonic(), read here without
        #: their ``time()`` method around it (a frame every timeout)
        self._now: Callable[[], float] = (
            time.monotonic if getattr(type(loop), "time", None) is _base_time else loop.time)
        self._queues: dict[float, deque[Deadline]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed = float("inf")

    def timeout(self, seconds: float | None) -> Deadline:
        """A timeout of ``seconds`` from the block's start on this queue (None: none)."""
        return Deadline(seconds, self)

    def add(self, d: Deadline, seconds: float) -> None:
        d.when = self._now() + seconds
        # Blocks of one duration start in deadline order (to the millisecond: a later one
        # behind an earlier one fires when that does, at most a millisecond late).
        q = self._queues.get(seconds)  # a key is its own rounding: round() costs 180 ns
        if q is None:
            key = round(seconds, 3)
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = deque()
        q.append(d)
        d._fifo = q
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


def _of_loop(loop: asyncio.AbstractEventLoop) -> Deadlines:
    global _last
    last_loop, d = _last
    if loop is last_loop and d is not None:
        return d
    d = _by_loop.get(loop)
    if d is None:
        d = _by_loop[loop] = Deadlines(loop)
    _last = (loop, d)
    return d


def timeout(seconds: float | None) -> Deadline:
    """Like ``asyncio.timeout(seconds)``, on the running loop's one timer."""
    return Deadline(seconds)


_new = object.__new__


def deadline(seconds: float | None) -> Deadline:
    """:func:`timeout`'s block started now, without ``async with`` (:meth:`Deadline.enter`);
    its :meth:`Deadline.leave` must follow.

    Every HTTP attempt takes one, so the usual case (the running loop's queue is the last
    one asked about) is :meth:`Deadline.__init__` and :meth:`~Deadline.enter` in this one
    frame (with the clocks' ``deadline`` this function itself), then
    :meth:`Deadlines.add`, which reads the loop's clock without its method: the timeout
    took 8,800 of the chain's 31,800 instructions a call over an attempt that yields once,
    as six frames, now about 7,000 in two (cachegrind, the timeout replaced by a no-op to
    measure it). Anything else goes the long way."""
    queue = _last[1]
    if seconds is None or queue is None:
        return Deadline(seconds).enter()
    loop = queue._loop
    if getattr(loop, "_thread_id", None) != get_ident():
        return Deadline(seconds).enter()
    task = _running_task(loop)
    if task is None:
        return Deadline(seconds).enter()
    d: Deadline = _new(Deadline)
    d.seconds = seconds
    d._queue = queue
    d.task = task
    d._expired = False
    d._cancelling = task.cancelling()
    queue.add(d, seconds)
    return d


def deadlines() -> Deadlines:
    """The running loop's :class:`Deadlines`."""
    return _of_loop(asyncio.get_running_loop())
