"""The run-health section's reads (SQL): each provider's minutes of its latest run from
``run_minutes``, plus the backlog state (dead letters with ages, overdue consents)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from sqlalchemy import inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.observe.minutes import MinuteRow
from batch.observe.state import StoreState, read_state
from planning.calendar import KST


@dataclass(frozen=True, slots=True)
class RunHealth:
    """What the run-health section shows: the minutes of ``run_id`` on ``day``."""

    day: date
    run_id: str | None
    minutes: tuple[MinuteRow, ...]
    state: StoreState

    def providers(self) -> list[str]:
        return sorted({m.org_code for m in self.minutes})

    def of(self, org_code: str) -> list[MinuteRow]:
        return [m for m in self.minutes if m.org_code == org_code]


async def load_run_health(engine: AsyncEngine, *, day: date, now: datetime) -> RunHealth:
    """The latest run on ``day`` (KST) that wrote minutes, and the state at ``now``."""
    start = datetime.combine(day, time(0), KST)
    end = start + timedelta(days=1)
    m = schema.run_minutes
    async with connect(engine) as conn:
        if not await conn.run_sync(lambda c: inspect(c).has_table(m.name)):
            return RunHealth(day, None, (), StoreState(read_at=now))
        r = schema.runs
        run_id = (await conn.execute(
            select(r.c.run_id).where(r.c.day == day, r.c.run_id.in_(
                select(m.c.run_id).where(m.c.minute_at >= start, m.c.minute_at < end)))
            .order_by(r.c.started_at.desc()).limit(1))).scalar()
        rows = [] if run_id is None else (await conn.execute(
            select(m).where(m.c.run_id == run_id).order_by(m.c.org_code, m.c.minute_at)
        )).all()
    minutes = tuple(MinuteRow(**{**dict(row._mapping), "org_code": str(row.org_code).strip()})
                    for row in rows)
    return RunHealth(day, run_id, minutes, await read_state(engine, now=now))
