"""batch/db/handoff.py: the switch interval is lowered only while a statement is in flight."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator

import pytest

from batch.db.handoff import SWITCH_INTERVAL, GilHandoff


@pytest.fixture(autouse=True)
def _interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


async def test_the_interval_is_short_only_while_a_statement_is_in_flight() -> None:
    h = GilHandoff()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    async with h:
        assert h.active
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    assert not h.active
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert h.entered == 1


async def test_nested_and_concurrent_hand_offs_restore_the_interval_once_all_are_out() -> None:
    a, b = GilHandoff(), GilHandoff()  # two stores in one process share the interval
    async with a:
        async with a, b:
            assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)  # a still in
    assert sys.getswitchinterval() == pytest.approx(0.005)


async def test_an_interval_the_operator_set_shorter_is_kept_and_restored() -> None:
    sys.setswitchinterval(20e-6)
    async with GilHandoff():
        assert sys.getswitchinterval() == pytest.approx(20e-6)
    assert sys.getswitchinterval() == pytest.approx(20e-6)


async def test_a_statement_that_raises_still_restores_the_interval() -> None:
    with pytest.raises(RuntimeError):
        async with GilHandoff():
            raise RuntimeError("statement failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_thread_gets_the_gil_from_a_busy_loop_only_under_the_hand_off() -> None:
    """The starvation it exists for, counted rather than timed: a thread wanting the GIL
    in short bursts (as the driver's does between a statement's steps) against a loop
    that drops the GIL only for an instant each turn (a loaded machine may hand it over
    there, once a turn). Over the same turns of the loop the thread gets many times more
    bursts in under the hand-off (it asks for the GIL within the turns)."""

    def bursts(turns: int, under: bool) -> int:
        done = 0
        stop = threading.Event()

        def want_the_gil() -> None:
            nonlocal done
            while not stop.is_set():
                stop.wait(0.0002)  # the GIL let go, as in sqlite3_step
                done += 1  # needs it back

        async def busy() -> None:
            for _ in range(turns):
                x = 0
                for i in range(200_000):  # a turn of pure Python, ~10 ms
                    x += i
                await asyncio.sleep(0)

        async def main() -> None:
            if under:
                async with GilHandoff():
                    await busy()
            else:
                await busy()

        t = threading.Thread(target=want_the_gil)
        t.start()
        try:
            asyncio.run(main())
        finally:
            stop.set()
            t.join()
        return done

    # Outside the hand-off the thread asks for the GIL only after a whole interval without
    # a switch: 50 ms here (5 by default), so that a loaded machine stretching the loop's
    # turns past it does not hand the thread the GIL by chance; the hand-off lowers it all
    # the same.
    sys.setswitchinterval(0.05)
    starved = bursts(40, under=False)  # at most about one burst a turn, at its select()
    handed = bursts(40, under=True)
    assert handed > 4 * max(starved, 1), (starved, handed)
