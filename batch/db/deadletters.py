"""Open dead letters and the operator's requeue.

A requeue makes a dead-lettered consent due again this week, and nothing else: a consent
fetched this week since it was dead-lettered is never made due again (it would be a second
transfer in one week), a consent a worker holds a live lease on is left to that worker, and
a dead or revoked consent stays as it is. Each refusal is one line naming the dead letter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.db.engine import connect, transaction
from batch.db.schema import consents, dead_letters, institutions
from batch.errors import InputError
from planning.calendar import kst_date, week_start


async def list_open(engine: AsyncEngine, *, org_code: str | None = None) -> Sequence[Any]:
    q = select(dead_letters).where(dead_letters.c.requeued_at.is_(None)).order_by(
        dead_letters.c.id)
    if org_code:
        q = q.where(dead_letters.c.org_code == org_code)
    async with connect(engine) as conn:
        return (await conn.execute(q)).all()


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """What a requeue did: consents made due again, and one reason per refused letter."""

    requeued: int
    refused: tuple[str, ...]


def refusal(row: Any, *, now: datetime, week_start_at: datetime) -> str | None:
    """Why the consent of a dead letter may not be made due again, or None (pure)."""
    who = f"dead letter {row.id} (consent {row.consent_id})"
    if row.status != "active":
        return f"{who}: the consent is {row.status}; not requeued"
    last = row.last_scheduled_at
    if last is not None and last >= week_start_at:
        return (f"{who}: fetched this week ({last.astimezone(KST):%Y-%m-%d %H:%M} KST); "
                "not due again before next week")
    if row.due_week > kst_date(week_start_at):
        return f"{who}: done for this week (due again {row.due_week}); not requeued"
    if row.lease_until is not None and row.lease_until > now:
        return (f"{who}: leased by worker {row.lease_owner} until "
                f"{row.lease_until.astimezone(KST):%H:%M:%S} KST (a run is working on it); "
                "try again after the run")
    return None


async def requeue(engine: AsyncEngine, *, now: datetime, org_code: str | None = None,
                  ids: Sequence[int] = ()) -> RequeueResult:
    """Mark the chosen open dead letters requeued and make their consents due now, except
    those :func:`refusal` names; one transaction. An ``org_code`` or id that names nothing
    is an InputError and changes nothing."""
    week = week_start(kst_date(now))
    week_start_at = datetime.combine(week, time(0), tzinfo=KST)
    d, c = dead_letters.c, consents.c
    cond: list[ColumnElement[bool]] = []
    if org_code:
        cond.append(d.org_code == org_code)
    if ids:
        cond.append(d.id.in_(list(ids)))
    async with transaction(engine) as conn:
        if org_code and (await conn.execute(select(institutions.c.org_code).where(
                institutions.c.org_code == org_code))).first() is None:
            raise InputError(f"no provider {org_code!r} in the database", field="--org")
        q = (select(d.id, d.consent_id, d.requeued_at, c.status, c.last_scheduled_at,
                    c.due_week, c.lease_owner, c.lease_until)
             .join(consents, consents.c.id == d.consent_id).where(*cond).order_by(d.id))
        if conn.dialect.name == "postgresql":
            q = q.with_for_update(of=consents)
        rows = (await conn.execute(q)).all()
        missing = sorted(set(ids) - {r.id for r in rows})
        if missing:
            raise InputError(f"no dead letter with id {', '.join(map(str, missing))}; "
                             "see: mydata-batch requeue --list", field="--id")
        refused: list[str] = []
        chosen: list[Any] = []
        for r in rows:
            if r.requeued_at is not None:
                if ids:
                    refused.append(f"dead letter {r.id} (consent {r.consent_id}): already "
                                   f"requeued at {r.requeued_at.astimezone(KST):%Y-%m-%d %H:%M}"
                                   " KST")
                continue
            why = refusal(r, now=now, week_start_at=week_start_at)
            if why is None:
                chosen.append(r)
            else:
                refused.append(why)
        if not chosen:
            return RequeueResult(0, tuple(refused))
        consent_ids = sorted({r.consent_id for r in chosen})
        await conn.execute(update(dead_letters).where(
            d.id.in_([r.id for r in chosen])).values(requeued_at=now))
        # The same rules once more in the statement, so nothing slips in between.
        await conn.execute(update(consents).where(
            c.id.in_(consent_ids), c.status == "active", c.due_week <= week,
            or_(c.last_scheduled_at.is_(None), c.last_scheduled_at < week_start_at),
            or_(c.lease_until.is_(None), c.lease_until <= now),
        ).values(
            due_week=week, attempts=0, unknown_attempts=0, not_before=now, week_result=None,
            lease_owner=None, lease_until=None, updated_at=now))
    return RequeueResult(len(consent_ids), tuple(refused))
