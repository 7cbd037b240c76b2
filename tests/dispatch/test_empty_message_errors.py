"""An exception with an empty message (``TimeoutError()``) from the store crashes neither the
producer nor the outcome writer: the run goes on and every outcome is written once the
store recovers. FakeClock and the in-memory store: no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

from batch.client import RefreshResult
from batch.clock import KST, FakeClock
from batch.db.memory import MemoryWorkStore
from batch.db.work import Claim
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.provider import DispatchSettings, ProviderDispatcher
from batch.dispatch.writer import OutcomeWriter
from batch.lifecycle import Change
from batch.resilience.outcomes import Kind, Outcome

DAY = date(2026, 11, 30)
WEEK = date(2026, 11, 29)
ORG = "BANK000001"


class FlakyStore(MemoryWorkStore):
    """The in-memory store whose claims and writes first fail with ``TimeoutError()``."""

    def __init__(self, *, claim_failures: int = 0, write_failures: int = 0) -> None:
        super().__init__()
        self.claim_failures = claim_failures
        self.write_failures = write_failures

    async def claim(self, org_code: str, **kw: Any) -> list[Claim]:
        if self.claim_failures:
            self.claim_failures -= 1
            raise TimeoutError()
        return await super().claim(org_code, **kw)

    async def apply(self, changes: Sequence[Change], **kw: Any) -> None:
        if self.write_failures:
            self.write_failures -= 1
            raise TimeoutError()
        await super().apply(changes, **kw)


async def _run_day(store: FlakyStore, n: int) -> tuple[ProviderDispatcher, OutcomeWriter,
                                                        bool]:
    clock = FakeClock(datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))
    store.add(ORG, n, week=WEEK, not_before=clock.now() - timedelta(days=1))

    async def ok(claim: Claim, not_after: float | None) -> RefreshResult:
        return RefreshResult(Outcome(Kind.SUCCESS, "00000", 200), calls=2)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=DAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=ok, writer=writer, clock=clock,
        settings=DispatchSettings(worker_id="w1"), policy=RetryPolicy(), day=DAY, week=WEEK,
        quota=n, minutes={60: n}, per_minute_cap=100_000, breaker_open=lambda: False)
    wt = writer.start()
    task = asyncio.create_task(d.run(asyncio.Event()))
    await clock.run_for(200)
    await task  # no exception: the producer kept going
    closed = await writer.close()
    await wt
    return d, writer, closed


async def test_the_producer_survives_an_empty_message_timeout_from_the_store() -> None:
    store = FlakyStore(claim_failures=3)
    d, _writer, closed = await _run_day(store, 50)
    assert d.stats.claim_errors == 3
    assert d.stats.succeeded == 50
    assert closed and len(store.outcomes) == 50


async def test_the_writer_survives_an_empty_message_timeout_and_writes_once_it_recovers(
        ) -> None:
    store = FlakyStore(write_failures=2)
    d, writer, closed = await _run_day(store, 50)
    assert writer.failures == 2
    assert writer.last_error == "TimeoutError"
    assert closed and writer.healthy
    assert sorted(r["consent_id"] for r in store.outcomes) == sorted(store.consents)
    assert d.stats.succeeded == 50
