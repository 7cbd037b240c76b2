"""What the database says about the backlog, read at export time (never on the hot path)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from planning.calendar import kst_date, week_start


@dataclass(frozen=True, slots=True)
class StoreState:
    """Per provider: open dead letters and the oldest one's age; consents overdue past their
    week; and when a run last finished with status ``done``."""

    read_at: datetime
    dead_letters: dict[str, int] = field(default_factory=dict)
    dead_letter_oldest_age: dict[str, float] = field(default_factory=dict)
    overdue: dict[str, int] = field(default_factory=dict)
    last_success: datetime | None = None


async def read_state(engine: AsyncEngine, *, now: datetime) -> StoreState:
    """Three small aggregate queries; ``now`` (aware) sets the week and the ages."""
    week = week_start(kst_date(now))
    dl = schema.dead_letters
    c = schema.consents
    r = schema.runs
    async with connect(engine) as conn:
        rows = (await conn.execute(
            select(dl.c.org_code, func.count().label("n"), func.min(dl.c.entered_at)
                   .label("oldest")).where(dl.c.requeued_at.is_(None))
            .group_by(dl.c.org_code))).all()
        overdue = (await conn.execute(
            select(c.c.org_code, func.count().label("n"))
            .where(c.c.status == "active", c.c.due_week < week).group_by(c.c.org_code))).all()
        last = (await conn.execute(
            select(func.max(r.c.finished_at)).where(r.c.status == "done"))).scalar()
    dead = {str(x.org_code).strip(): int(x.n) for x in rows}
    ages = {str(x.org_code).strip(): max(0.0, (now - _aware(x.oldest)).total_seconds())
            for x in rows if x.oldest is not None}
    return StoreState(read_at=now, dead_letters=dead, dead_letter_oldest_age=ages,
                      overdue={str(x.org_code).strip(): int(x.n) for x in overdue},
                      last_success=_aware(last) if last is not None else None)


def _aware(value: object) -> datetime:
    # UTCDateTime gives aware datetimes; an aggregate over it may come back raw.
    from datetime import UTC

    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
