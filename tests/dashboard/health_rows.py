"""A run's minutes for the run-health section: a retry storm that opens the breaker."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.observe.minutes import MinuteRow
from tests.dashboard.conftest import BANK, CARD, EVIL, at

RUN = "run-2"  # the fixture's run of today
OPEN = range(6, 9)  # BANK's breaker is open in these minutes


def bank_minute(i: int) -> MinuteRow:
    """Minute ``i`` of BANK: healthy, then retries climbing from minute 4, open 6-8."""
    row = MinuteRow(RUN, BANK, at(2) + timedelta(minutes=i), planned=100,
                    lateness_p99_ms=1.5 + i * 0.25)
    if i in OPEN:
        row.rejected, row.breaker_state, row.breaker_open_seconds = 40, "open", 60.0
        return row
    storm = i >= 4
    row.started = row.calls = 95 if storm else 100
    row.success, row.fault, row.timeout = row.calls - 20, 15, 5
    row.retried = 10 + 8 * i if storm else 2
    row.attempts = row.calls + row.retried
    row.max_attempts = 6 if storm else 0
    row.latency_p99_ms = 80.0 + (400.0 * i if storm else 0.0)
    row.breaker_state = "half_open" if i == 9 else "closed"
    return row


def card_minute(i: int) -> MinuteRow:
    return MinuteRow(RUN, CARD, at(2) + timedelta(minutes=i), planned=20, started=20,
                     calls=20, success=20, attempts=20, latency_p99_ms=40.0,
                     lateness_p99_ms=1.0)


async def add_minutes(engine: AsyncEngine) -> None:
    """12 minutes of BANK and CARD in today's run from 01:00 KST, and a provider code that
    is markup (it must come out escaped)."""
    rows = [r for i in range(12) for r in (bank_minute(i), card_minute(i))]
    rows.append(MinuteRow(RUN, EVIL[:10], at(2), planned=1))
    async with engine.begin() as conn:
        await conn.execute(insert(schema.run_minutes), [r.values() for r in rows])
