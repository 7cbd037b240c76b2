from __future__ import annotations

import asyncio

import pytest

from batch.clock import FakeClock


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
