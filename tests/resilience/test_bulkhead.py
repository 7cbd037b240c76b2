"""The bulkhead: N calls in flight, a maximum wait, FIFO hand-over, nothing leaks."""

from __future__ import annotations

import asyncio

from batch.clock import FakeClock
from batch.resilience import (
    BreakerSettings,
    BulkheadSettings,
    ChainSettings,
    LimiterSettings,
    ProviderChain,
    WindowType,
)
from batch.resilience.bulkhead import Bulkhead
from batch.resilience.outcomes import Kind, Layer
from tests.resilience.fakes import Provider, drive_all


def chain(clock: FakeClock, bulkhead: BulkheadSettings) -> ProviderChain:
    s = ChainSettings(bulkhead=bulkhead, limiter=LimiterSettings(calls_per_second=1e6,
                                                                 burst=1000),
                      breaker=BreakerSettings(window_type=WindowType.COUNT, minimum_calls=10,
                                              window_size=20))
    return ProviderChain("BANK000001", s, clock=clock)


async def test_a_call_waiting_longer_than_the_max_wait_is_rejected() -> None:
    clock = FakeClock()
    provider = Provider(clock, latency=10.0)
    c = chain(clock, BulkheadSettings(max_concurrent=2, max_wait=0.5))
    outs = await drive_all(clock, [c.call(provider) for _ in range(3)])
    assert [o.kind for o in outs] == [Kind.SUCCESS, Kind.SUCCESS, Kind.REJECTED]
    assert outs[2].layer is Layer.BULKHEAD and outs[2].attempts == 0
    assert provider.calls == 2
    assert c.breaker.rates()[2] == 2  # the rejection is neutral, not a failure
    assert (c.bulkhead.in_use, c.bulkhead.waiting) == (0, 0)


async def test_a_waiting_call_gets_the_first_freed_permit() -> None:
    clock = FakeClock()
    provider = Provider(clock, latency=1.0)
    c = chain(clock, BulkheadSettings(max_concurrent=2, max_wait=5.0))
    outs = await drive_all(clock, [c.call(provider) for _ in range(5)])
    assert all(o.ok for o in outs)
    assert provider.starts == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert c.bulkhead.in_use == 0


async def test_with_no_max_wait_a_full_bulkhead_rejects_at_once() -> None:
    clock = FakeClock()
    provider = Provider(clock, latency=1.0)
    c = chain(clock, BulkheadSettings(max_concurrent=1, max_wait=0.0))
    outs = await drive_all(clock, [c.call(provider) for _ in range(2)])
    assert [o.kind for o in outs] == [Kind.SUCCESS, Kind.REJECTED]


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    clock = FakeClock()
    b = Bulkhead(1)
    assert b.try_acquire()
    waiter = asyncio.ensure_future(b.acquire(clock, 10.0))
    await asyncio.sleep(0)
    assert b.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert b.waiting == 0
    b.release()
    assert b.in_use == 0 and b.try_acquire()


async def test_a_permit_handed_to_a_waiter_cancelled_at_that_moment_is_passed_on() -> None:
    clock = FakeClock()
    b = Bulkhead(1)
    assert b.try_acquire()
    first = asyncio.ensure_future(b.acquire(clock, 10.0))
    second = asyncio.ensure_future(b.acquire(clock, 10.0))
    await asyncio.sleep(0)
    b.release()        # hands the permit to `first` ...
    first.cancel()     # ... which is cancelled before it runs
    await asyncio.gather(first, return_exceptions=True)
    assert await second is True
    assert b.in_use == 1
    b.release()
    assert b.in_use == 0


async def test_cancelling_a_call_in_flight_frees_its_bulkhead_permit() -> None:
    clock = FakeClock()
    provider = Provider(clock, latency=100.0)
    c = chain(clock, BulkheadSettings(max_concurrent=1, max_wait=0.0))
    task = asyncio.ensure_future(c.call(provider))
    await asyncio.sleep(0)
    assert c.bulkhead.in_use == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert c.bulkhead.in_use == 0


async def test_a_lowered_limit_lets_calls_finish_and_a_raised_one_lets_waiters_in() -> None:
    b = Bulkhead(4)
    assert all(b.try_acquire() for _ in range(4))
    b.set_limit(2)  # four in flight, two allowed: nobody new until fewer than two
    clock = FakeClock()
    waiter = asyncio.create_task(b.acquire(clock, 60.0))
    await asyncio.sleep(0)
    b.release()
    b.release()
    await asyncio.sleep(0)
    assert not waiter.done() and b.in_use == 2
    b.release()  # one in use now: the waiter gets the freed permit
    await asyncio.sleep(0)
    assert waiter.done() and b.in_use == 2
    more = [asyncio.create_task(b.acquire(clock, 60.0)) for _ in range(3)]
    await asyncio.sleep(0)
    b.set_limit(4)  # raised: two of the three waiters in at once
    await asyncio.sleep(0)
    assert [t.done() for t in more] == [True, True, False] and b.in_use == 4
    b.set_limit(5)
    await asyncio.sleep(0)
    assert more[2].done() and b.in_use == 5
