"""batch/deadlines.py: asyncio.timeout's semantics on one timer, driven by a fake loop time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from batch.deadlines import Deadlines, deadline, deadlines, timeout


class _Timer:
    def __init__(self, when: float, cb: Callable[[], None]) -> None:
        self.when, self.cb, self.cancelled = when, cb, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """What Deadlines uses of a loop: time() and call_at(); time moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, cb: Callable[[], None]) -> _Timer:
        t = _Timer(when, cb)
        self.timers.append(t)
        return t

    def advance(self, dt: float) -> None:
        self.now += dt
        for t in sorted(self.timers, key=lambda t: t.when):
            if not t.cancelled and t.when <= self.now:
                t.cancelled = True
                t.cb()

    @property
    def armed(self) -> list[float]:
        return sorted(t.when for t in self.timers if not t.cancelled)


def _queue() -> tuple[Deadlines, FakeLoop]:
    loop = FakeLoop()
    return Deadlines(loop), loop  # type: ignore[arg-type]


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_block_past_its_deadline_raises_timeout_error() -> None:
    q, loop = _queue()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def body() -> str:
        try:
            async with q.timeout(5.0):
                await never
        except TimeoutError:
            return "timed out"
        return "finished"

    task = asyncio.create_task(body())
    await _settle()
    loop.advance(4.999)
    await _settle()
    assert not task.done()
    loop.advance(0.001)
    assert await task == "timed out"
    assert task.cancelling() == 0  # the cancellation was ours, taken back


async def test_one_timer_serves_many_blocks_of_the_same_duration() -> None:
    q, loop = _queue()
    for _ in range(100):
        async with q.timeout(20.0):
            await asyncio.sleep(0)
        loop.now += 0.01
    assert loop.armed == [120.0]  # the first block's deadline: one timer for them all
    assert q.pending == 0  # each ended block was the oldest of its FIFO: dropped at once
    loop.advance(20.0)  # the timer finds nothing left, arms nothing more
    assert loop.armed == []


async def test_blocks_ending_out_of_order_leave_only_what_is_in_flight() -> None:
    q, _loop = _queue()
    gates = [asyncio.get_running_loop().create_future() for _ in range(5)]

    async def block(i: int) -> None:
        async with q.timeout(20.0):
            await gates[i]

    tasks = [asyncio.create_task(block(i)) for i in range(5)]
    await _settle()
    for i in (1, 2, 4):  # end behind the oldest: they wait as dead entries
        gates[i].set_result(None)
    await _settle()
    assert q.pending == 5
    gates[0].set_result(None)  # the oldest ends: it and the dead behind it go
    await _settle()
    assert q.pending == 2  # 3 (in flight) and 4 (dead, behind it)
    gates[3].set_result(None)
    await asyncio.gather(*tasks)
    assert q.pending == 0


async def test_a_shorter_timeout_arms_the_timer_earlier_and_fires_first() -> None:
    q, loop = _queue()
    done: list[str] = []

    async def wait(name: str, seconds: float) -> None:
        try:
            async with q.timeout(seconds):
                await asyncio.get_running_loop().create_future()
        except TimeoutError:
            done.append(name)

    tasks = [asyncio.create_task(wait("long", 20.0)), asyncio.create_task(wait("short", 0.5))]
    await _settle()
    assert loop.armed[0] == 100.5
    loop.advance(0.5)
    await _settle()
    assert done == ["short"]
    loop.advance(19.5)
    await asyncio.gather(*tasks)
    assert done == ["short", "long"]


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout() -> None:
    q, loop = _queue()

    async def body() -> None:
        async with q.timeout(5.0):
            await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(body())
    await _settle()
    task.cancel()
    loop.advance(5.0)  # expires too, after the outside cancel
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_block_that_ends_in_time_is_never_cancelled() -> None:
    q, loop = _queue()
    async with q.timeout(1.0):
        await asyncio.sleep(0)
    loop.advance(10.0)
    await asyncio.sleep(0)  # a stray cancel would land here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_no_deadline_is_a_plain_block() -> None:
    q, loop = _queue()
    async with q.timeout(None):
        await asyncio.sleep(0)
    assert loop.timers == [] and q.pending == 0


async def test_the_running_loop_has_one_queue() -> None:
    first: Any = deadlines()
    assert deadlines() is first
    async with timeout(0.5):
        assert first.pending == 1  # the block waits in the running loop's queue
    assert first.pending == 0


def test_a_timeout_takes_its_own_task_while_another_loop_runs_in_a_thread() -> None:
    # The block finds its task in asyncio's table of running tasks through the last loop
    # asked about; here that loop is running in another thread, so the block must not take
    # that loop's task (and time out the wrong call) but its own.
    started, release = threading.Event(), threading.Event()
    theirs: list[asyncio.Task[Any] | None] = []

    async def other() -> None:
        async with timeout(30):  # this loop becomes the last one asked about
            theirs.append(asyncio.current_task())
            started.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)

    thread = threading.Thread(target=asyncio.run, args=(other(),))
    thread.start()
    try:
        assert started.wait(10)

        async def mine() -> bool:
            try:
                async with timeout(0.01):
                    await asyncio.sleep(5)
            except TimeoutError:
                return True
            return False

        assert asyncio.run(mine())  # timed out on its own loop, in time
        assert theirs[0] is not None and not theirs[0].cancelling()
    finally:
        release.set()
        thread.join(10)
    assert not thread.is_alive()


async def test_blocks_on_the_running_loop_find_their_task() -> None:
    async def block() -> asyncio.Task[Any] | None:
        d = timeout(5)
        async with d:
            return d.task
    tasks = [asyncio.create_task(block()) for _ in range(3)]
    assert await asyncio.gather(*tasks) == tasks


async def test_a_block_entered_and_left_by_hand_reports_its_own_expiry() -> None:
    """enter()/leave(), the chain's form of the block: leave() is True only when this
    timeout expired and cancelled the task (taken back), and a second leave() is nothing."""
    q, loop = _queue()

    async def body(outside_cancel: bool) -> str:
        d = q.timeout(5.0).enter()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if not d.leave():
                raise
            return "timed out"
        finally:
            assert d.leave() is False  # left already: nothing more
        return "finished"

    expired = asyncio.create_task(body(False))
    await _settle()
    loop.advance(5.0)
    assert await expired == "timed out"
    assert expired.cancelling() == 0
    assert q.pending == 0

    elsewhere = asyncio.create_task(body(True))
    await _settle()
    elsewhere.cancel()
    loop.advance(5.0)  # expires too, after the outside cancel: not ours to swallow
    with pytest.raises(asyncio.CancelledError):
        await elsewhere

    d = q.timeout(1.0).enter()
    await asyncio.sleep(0)
    assert d.leave() is False  # ended in time
    loop.advance(10.0)
    await asyncio.sleep(0)  # a stray cancel would land here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_deadline_joins_the_running_loops_queue_and_expires_its_own_task() -> None:
    """``deadline()``, the chain's form on the real loop (its short way: no Deadline.enter,
    no Deadlines.add): the entry waits in the running loop's queue, with its task and a
    deadline on the loop's clock, its expiry cancels that task and leave() owns it."""
    queue: Any = deadlines()
    loop = asyncio.get_running_loop()

    async def body(seconds: float) -> str:
        before = loop.time()
        d = deadline(seconds)
        assert d.task is asyncio.current_task()
        assert before + seconds <= d.when <= loop.time() + seconds
        assert queue.pending >= 1
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            if not d.leave():
                raise
            return "timed out"
        finally:
            assert d.leave() is False
        return "finished"

    task = asyncio.create_task(body(0.02))
    assert await asyncio.wait_for(task, 2) == "timed out"
    assert task.cancelling() == 0
    assert queue.pending == 0

    quick = deadline(5.0)
    await asyncio.sleep(0)
    assert quick.leave() is False and queue.pending == 0  # left in time: nothing held

    elsewhere = asyncio.create_task(body(30.0))
    await _settle()
    elsewhere.cancel()  # not this timeout's cancellation: it propagates
    with pytest.raises(asyncio.CancelledError):
        await elsewhere


def test_deadline_in_a_new_loop_takes_that_loops_queue() -> None:
    # the last loop asked about has stopped: a deadline in the next one goes the long way
    # once and joins its own loop's queue, then the short way from there
    async def one() -> tuple[Any, Any, Any]:
        a = deadline(5.0)
        b = deadline(5.0)
        q = deadlines()
        pending = q.pending
        a.leave()
        b.leave()
        return a, q, pending

    first = asyncio.run(one())
    second = asyncio.run(one())
    assert first[1] is not second[1]
    assert first[2] == second[2] == 2
    assert second[0]._queue is second[1]
