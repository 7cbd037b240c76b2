"""cancel_and_wait: a task that absorbs a cancellation is still stopped; one that never
stops is left behind with a warning instead of hanging the caller. finish_first: a write
runs to its end before its caller's cancellation goes on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from batch.aio import cancel_and_wait, finish_first


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


def test_finish_first_lets_the_work_end_then_raises_every_cancellation_as_one() -> None:
    async def go() -> tuple[list[str], asyncio.Task[str]]:
        steps: list[str] = []
        gate = asyncio.Event()

        async def write() -> str:
            steps.append("begun")
            await gate.wait()
            steps.append("committed")
            return "rows"

        caller = asyncio.create_task(finish_first(write()))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for _ in range(3):  # cancel_and_wait asks again and again
            caller.cancel()
            await asyncio.sleep(0)
        assert not caller.done() and steps == ["begun"]
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return steps, caller

    steps, caller = asyncio.run(go())
    assert steps == ["begun", "committed"] and caller.cancelled()


def test_finish_first_returns_or_raises_as_the_work_does_when_not_cancelled() -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    async def fails() -> int:
        await asyncio.sleep(0)
        raise ConnectionRefusedError("the database is down")

    async def go() -> int:
        with pytest.raises(ConnectionRefusedError):
            await finish_first(fails())
        return await finish_first(ok())

    assert asyncio.run(go()) == 7


def test_finish_first_cancelled_while_the_work_fails_raises_the_cancellation_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        gate = asyncio.Event()

        async def fails() -> None:
            await gate.wait()
            raise ConnectionRefusedError("the database is down")

        caller = asyncio.create_task(finish_first(fails()))
        await asyncio.sleep(0)
        caller.cancel()
        await asyncio.sleep(0)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await caller

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(go())
    assert "never retrieved" not in caplog.text
