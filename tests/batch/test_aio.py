"""cancel_and_wait: a task that absorbs a cancellation is still stopped; one that never
stops is left behind with a warning instead of hanging the caller."""

from __future__ import annotations

import asyncio
import logging

import pytest

from batch.aio import cancel_and_wait


async def _absorbs_once() -> None:
    swallowed = False
    while True:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True  # what a retrying client does with a timeout that raced it


async def _never_stops() -> None:
    while True:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            continue


def test_a_task_that_absorbed_one_cancellation_is_cancelled_again_and_ends() -> None:
    async def go() -> tuple[bool, asyncio.Task[None]]:
        t = asyncio.create_task(_absorbs_once())
        await asyncio.sleep(0)
        ok = await asyncio.wait_for(cancel_and_wait([t], every=0.05), 5)
        return ok, t

    ok, t = asyncio.run(go())
    assert ok and t.cancelled()


def test_a_plain_gather_after_one_cancel_would_have_hung() -> None:
    """The failure cancel_and_wait exists for (so the test above can fail)."""
    async def go() -> bool:
        t = asyncio.create_task(_absorbs_once())
        await asyncio.sleep(0)
        t.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(t), 0.3)
        except TimeoutError:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
            return False
        return True

    assert asyncio.run(go()) is False


def test_a_task_that_never_stops_is_left_behind_loudly(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    async def go() -> bool:
        t = asyncio.create_task(_never_stops(), name="stubborn")
        await asyncio.sleep(0)
        ok = await cancel_and_wait([t], every=0.01, tries=3)
        t.get_loop().call_soon(lambda: None)
        return ok

    with caplog.at_level(logging.WARNING, logger="mydata.aio"):
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(go()) is False
        finally:
            for t in asyncio.all_tasks(loop):
                t.cancel()
            # the stubborn task is abandoned with the loop
            loop.close()
    rec = [r for r in caplog.records if getattr(r, "action", "") == "tasks_left"]
    assert rec and rec[0].tasks == ["stubborn"]


def test_tasks_already_done_and_failed_are_retrieved_quietly() -> None:
    async def boom() -> None:
        raise ValueError("x")

    async def go() -> bool:
        t = asyncio.create_task(boom())
        await asyncio.sleep(0)
        return await cancel_and_wait([t])

    assert asyncio.run(go()) is True
