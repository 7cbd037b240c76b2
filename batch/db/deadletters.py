"""Open dead letters and the operator's requeue."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db.engine import transaction
from batch.db.schema import consents, dead_letters
from planning.calendar import kst_date, week_start


async def list_open(engine: AsyncEngine, *, org_code: str | None = None) -> Sequence[Any]:
    q = select(dead_letters).where(dead_letters.c.requeued_at.is_(None)).order_by(
        dead_letters.c.id)
    if org_code:
        q = q.where(dead_letters.c.org_code == org_code)
    async with engine.connect() as conn:
        return (await conn.execute(q)).all()


async def requeue(engine: AsyncEngine, *, now: datetime, org_code: str | None = None,
                  ids: Sequence[int] = ()) -> int:
    """Mark the chosen open dead letters requeued and make their consents due now; one
    transaction. Returns how many consents were requeued."""
    week = week_start(kst_date(now))
    cond: list[ColumnElement[bool]] = [dead_letters.c.requeued_at.is_(None)]
    if org_code:
        cond.append(dead_letters.c.org_code == org_code)
    if ids:
        cond.append(dead_letters.c.id.in_(list(ids)))
    async with transaction(engine) as conn:
        rows = (await conn.execute(
            select(dead_letters.c.id, dead_letters.c.consent_id).where(*cond))).all()
        if not rows:
            return 0
        consent_ids = sorted({r.consent_id for r in rows})
        await conn.execute(update(dead_letters).where(
            dead_letters.c.id.in_([r.id for r in rows])).values(requeued_at=now))
        await conn.execute(update(consents).where(
            consents.c.id.in_(consent_ids), consents.c.status == "active").values(
            due_week=week, attempts=0, unknown_attempts=0, not_before=now, week_result=None,
            lease_owner=None, lease_until=None, updated_at=now))
    return len(consent_ids)
