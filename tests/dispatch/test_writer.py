"""The outcome writer batches: a steady stream of outcomes makes one write per interval."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from batch.clock import KST, FakeClock
from batch.dispatch.writer import OutcomeWriter
from batch.lifecycle import Change, NotAttempted, Refreshed
from tests.resilience.fakes import drive, drive_all

DAY = date(2026, 11, 30)
ORG = "BANK000001"


def _change(cid: int) -> NotAttempted:
    return NotAttempted(Refreshed(cid, ORG, datetime(2026, 11, 30, 1, tzinfo=KST),
                                  "refused"))


class _SlowStore:
    """Each write takes ``seconds`` of the fake clock; what it was given is recorded."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.writes: list[list[int]] = []
        self.fail = False

    async def apply(self, changes: Sequence[Change], **_: Any) -> None:
        await self.clock.sleep(self.seconds)
        if self.fail:
            raise ConnectionError("database unreachable")
        self.writes.append([c.consent_id for c in changes])


async def _stream(clock: FakeClock, writer: OutcomeWriter, *, per_second: int,
                  seconds: float) -> int:
    """Add ``per_second`` outcomes a second for ``seconds``; returns how many."""
    n = 0
    for _ in range(int(seconds * per_second / 10)):
        for _ in range(10):
            n += 1
            writer.add(_change(n))
        await clock.sleep(10 / per_second)
    return n


def _writer(seconds: float) -> tuple[FakeClock, _SlowStore, OutcomeWriter]:
    """A writer flushing every 0.5 s into a store whose writes take ``seconds``."""
    clock = FakeClock()
    store = _SlowStore(clock, seconds=seconds)
    writer = OutcomeWriter(store, run_id="r", worker="w", day=DAY, clock=clock,  # type: ignore[arg-type]
                           interval=0.5)
    return clock, store, writer


def test_a_steady_stream_is_written_once_an_interval_not_once_a_round_trip() -> None:
    async def main() -> tuple[list[list[int]], int]:
        clock, store, writer = _writer(0.04)
        task = writer.start()
        n = await drive(clock, _stream(clock, writer, per_second=1000, seconds=10))
        assert await drive(clock, writer.close())
        await task
        return store.writes, n

    writes, n = asyncio.run(main())
    ids = [i for w in writes for i in w]
    assert ids == list(range(1, n + 1))  # everything, once, in order
    # 10 s at one write each 0.5 s (+ the write's own 0.04 s): about 19, plus the close.
    # A flush that kept going while outcomes arrived during its write made one write per
    # round trip instead: about 230 here.
    assert 15 <= len(writes) <= 25, len(writes)
    assert min(len(w) for w in writes[:-1]) >= 400


def test_close_drains_what_arrives_while_it_writes() -> None:
    async def main() -> tuple[list[list[int]], int]:
        clock, store, writer = _writer(0.04)
        for i in range(1, 4):
            writer.add(_change(i))

        async def late() -> bool:  # a refresh that finishes during the first write
            await clock.sleep(0.02)
            writer.add(_change(4))
            return True

        assert await drive_all(clock, [late(), writer.close()]) == [True, True]
        return store.writes, writer.pending

    writes, pending = asyncio.run(main())
    assert writes == [[1, 2, 3], [4]] and pending == 0


def test_a_failed_write_keeps_the_batch_and_the_next_one_writes_it() -> None:
    async def main() -> tuple[list[list[int]], bool, bool]:
        clock, store, writer = _writer(0.01)
        for i in range(1, 6):
            writer.add(_change(i))
        store.fail = True
        first = await drive(clock, writer.flush())
        healthy_after_failure = writer.healthy
        store.fail = False
        second = await drive(clock, writer.flush())
        return store.writes, first or healthy_after_failure, second

    writes, first_ok, second_ok = asyncio.run(main())
    assert not first_ok and second_ok
    assert writes == [[1, 2, 3, 4, 5]]
