from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batch.clock import FakeClock, ScaledClock, SystemClock


async def test_fake_sleep_wakes_only_when_clock_reaches_deadline() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(10)
        woke.append(clock.monotonic())

    task = asyncio.create_task(sleeper())
    await clock.run_for(9.999)
    assert woke == []
    await clock.run_for(0.001)
    assert woke == [10.0]
    await task


async def test_fake_timeout_raises_timeout_error_at_its_deadline() -> None:
    clock = FakeClock()

    async def slow() -> str:
        async with clock.timeout(60):
            await clock.sleep(3600)
        return "finished"

    task = asyncio.create_task(slow())
    await clock.run_for(59)
    assert not task.done()
    await clock.run_for(1)
    with pytest.raises(TimeoutError):
        await task


async def test_fake_timeout_does_not_fire_when_body_finishes_first() -> None:
    clock = FakeClock()

    async def quick() -> str:
        async with clock.timeout(5):
            await clock.sleep(1)
        return "ok"

    task = asyncio.create_task(quick())
    await clock.run_for(10)
    assert await task == "ok"


def test_fake_clock_refuses_to_go_backwards() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError):
        clock.advance(-1)
    start = clock.now()
    clock.advance(90)
    assert (clock.now() - start).total_seconds() == 90



@pytest.mark.parametrize("make", [FakeClock, SystemClock,
                                  lambda: ScaledClock(10.0, start=FakeClock().now())],
                         ids=["fake", "system", "scaled"])
async def test_every_clock_starts_a_timeout_block_by_hand(make: Any) -> None:
    """Clock.deadline: the timeout's block without ``async with`` (the chain's attempts);
    leave() says whether its own expiry cancelled the task."""
    clock = make()

    async def body(seconds: float) -> str:
        d = clock.deadline(seconds)
        try:
            await clock.sleep(0.5)
        except asyncio.CancelledError:
            if not d.leave():
                raise
            return "timed out"
        return "finished" if d.leave() is False else "leave() said expired"

    slow = asyncio.create_task(body(0.1))
    quick = asyncio.create_task(body(60.0))
    if isinstance(clock, FakeClock):
        await clock.run_for(1.0)
    assert await slow == "timed out"
    assert await quick == "finished"
    assert slow.cancelling() == 0
