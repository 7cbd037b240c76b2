"""The dispatcher's queries: claim due consents with a lease, release them, record outcomes.

Claims are a keyset scan over ``consents_due_idx`` (org_code, due_week, id): backlog weeks
first, then this week's consents in id order; never OFFSET. On PostgreSQL the scan locks with
``FOR UPDATE SKIP LOCKED`` so any number of workers can claim side by side; a claim carries a
lease, so a dead worker's consents come back once it expires. A claim found with an expired
lease from someone else may already have been called: it is marked as an unknown outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Date, Integer, String, bindparam, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.db.engine import transaction
from batch.db.schema import UTCDateTime, call_outcomes, consents, dead_letters

#: The keyset cursor: the last (due_week, id) handed out.
Cursor = tuple[date, int]
START: Cursor = (date(1970, 1, 1), 0)


@dataclass(frozen=True, slots=True)
class Claim:
    """One leased consent, ready to refresh. Tokens never appear in its repr."""

    id: int
    org_code: str
    user_id: str
    due_week: date
    attempts: int
    unknown_attempts: int
    stale: bool
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False, default=None)
    #: item ids still to fetch after this week's list call succeeded (JSON in the DB)
    pending_items: tuple[str, ...] | None = None

    @property
    def cursor(self) -> Cursor:
        return (self.due_week, self.id)


#: Due, unleased (or lease expired) consents of one provider after the keyset cursor.
_DUE = """
    FROM consents
    WHERE org_code = :org AND status = 'active' AND due_week <= :wk
      AND (due_week, id) > (:cur_week, :cur_id)
      AND not_before <= :now
      AND (lease_until IS NULL OR lease_until < :now)
    ORDER BY due_week, id
    LIMIT :n
"""
_PICK_PARAMS = (
    bindparam("org", type_=String), bindparam("wk", type_=Date),
    bindparam("cur_week", type_=Date), bindparam("cur_id", type_=Integer),
    bindparam("now", type_=UTCDateTime), bindparam("n", type_=Integer),
)

_PG_CLAIM = text(
    f"""
    WITH picked AS (
        SELECT id, lease_owner AS prev_owner {_DUE}
        FOR UPDATE SKIP LOCKED
    )
    UPDATE consents AS c
    SET lease_owner = :worker, lease_until = :until,
        unknown_attempts = c.unknown_attempts
            + CASE WHEN picked.prev_owner IS NOT NULL THEN 1 ELSE 0 END
    FROM picked
    WHERE c.id = picked.id
    RETURNING c.id, c.user_id, c.due_week, c.attempts, c.unknown_attempts,
              (picked.prev_owner IS NOT NULL) AS stale, c.access_token, c.refresh_token,
              c.pending_items
    """
).bindparams(*_PICK_PARAMS, bindparam("until", type_=UTCDateTime),
             bindparam("worker", type_=String))

# SQLite has one writer at a time: pick, then lease, in the same transaction.
_SQLITE_PICK = text(f"SELECT id, lease_owner {_DUE}").bindparams(*_PICK_PARAMS)


async def claim(
    engine: AsyncEngine,
    org_code: str,
    *,
    worker: str,
    week: date,
    now: datetime,
    limit: int,
    after: Cursor = START,
    lease: timedelta = timedelta(minutes=10),
) -> list[Claim]:
    """Lease up to ``limit`` due consents of ``org_code`` after ``after``, in keyset order."""
    if limit <= 0:
        return []
    params = {
        "org": org_code, "wk": week, "cur_week": after[0], "cur_id": after[1], "now": now,
        "n": limit, "worker": worker, "until": now + lease,
    }
    async with transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            # A lease is soft state: if the server crashed before this commit reached disk,
            # the consent is merely unleased again (and a repeat call meets the provider's
            # 42901), so the claim need not wait for the WAL flush. Outcomes, which are not
            # soft, keep synchronous commits.
            await conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            rows: Sequence[Any] = (await conn.execute(_PG_CLAIM, params)).all()
        else:
            rows = await _sqlite_claim(conn, params)
    claims = [
        Claim(id=r.id, org_code=org_code, user_id=r.user_id, due_week=_as_date(r.due_week),
              attempts=r.attempts, unknown_attempts=r.unknown_attempts, stale=bool(r.stale),
              access_token=r.access_token, refresh_token=r.refresh_token,
              pending_items=_items(r.pending_items))
        for r in rows
    ]
    claims.sort(key=lambda c: c.cursor)
    return claims


async def _sqlite_claim(conn: AsyncConnection, params: dict[str, object]) -> list[Any]:
    picked = (await conn.execute(_SQLITE_PICK, params)).all()
    if not picked:
        return []
    stale_ids = [r.id for r in picked if r.lease_owner is not None]
    ids = [r.id for r in picked]
    await conn.execute(
        update(consents).where(consents.c.id.in_(ids))
        .values(lease_owner=params["worker"], lease_until=params["until"])
    )
    if stale_ids:
        await conn.execute(
            update(consents).where(consents.c.id.in_(stale_ids))
            .values(unknown_attempts=consents.c.unknown_attempts + 1)
        )
    stale = set(stale_ids)
    rows = (await conn.execute(
        select(consents.c.id, consents.c.user_id, consents.c.due_week, consents.c.attempts,
               consents.c.unknown_attempts, consents.c.access_token, consents.c.refresh_token,
               consents.c.pending_items)
        .where(consents.c.id.in_(ids))
    )).all()
    return [_Row(r, r.id in stale) for r in rows]


class _Row:
    __slots__ = ("access_token", "attempts", "due_week", "id", "pending_items", "refresh_token",
                 "stale", "unknown_attempts", "user_id")

    def __init__(self, r: object, stale: bool) -> None:
        for name in ("id", "user_id", "due_week", "attempts", "unknown_attempts",
                     "access_token", "refresh_token", "pending_items"):
            setattr(self, name, getattr(r, name))
        self.stale = stale


def _items(raw: object) -> tuple[str, ...] | None:
    if raw is None:
        return None
    return tuple(str(x) for x in json.loads(str(raw)))


def _as_date(v: object) -> date:
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    return date.fromisoformat(str(v))


async def release(engine: AsyncEngine, ids: Sequence[int], *, worker: str) -> int:
    """Give back unstarted claims (graceful stop): they are due again at once."""
    if not ids:
        return 0
    async with transaction(engine) as conn:
        res = await conn.execute(
            update(consents)
            .where(consents.c.id.in_(list(ids)), consents.c.lease_owner == worker)
            .values(lease_owner=None, lease_until=None)
        )
    return int(res.rowcount or 0)


async def extend(engine: AsyncEngine, ids: Sequence[int], *, worker: str,
                 until: datetime) -> int:
    """Renew our leases on claims still queued or in flight (a heartbeat)."""
    n = 0
    for i in range(0, len(ids), 5000):
        chunk = list(ids[i:i + 5000])
        async with transaction(engine) as conn:
            res = await conn.execute(
                update(consents)
                .where(consents.c.id.in_(chunk), consents.c.lease_owner == worker)
                .values(lease_until=until)
            )
        n += int(res.rowcount or 0)
    return n


@dataclass(frozen=True, slots=True)
class Record:
    """One finished refresh, ready to write."""

    consent_id: int
    org_code: str
    action: str            # outcomes.Action value, or 'dead_letter'
    kind: str
    rsp_code: str | None
    tran_id: str | None
    calls: int
    elapsed_ms: int
    error: str | None
    at: datetime
    #: set for DONE/DONE_FOR_WEEK/dead letters: the week after the one done
    next_due_week: date | None = None
    #: for RETRY_LATER/UNKNOWN: not before this time
    not_before: datetime | None = None
    week_result: str | None = None
    pending_items: str | None = None
    count_attempt: bool = True
    count_unknown: bool = False
    dead_letter: bool = False
    attempts_total: int = 0
    week_start: date | None = None
    new_access_token: str | None = field(default=None, repr=False)
    new_refresh_token: str | None = field(default=None, repr=False)


async def write_records(
    engine: AsyncEngine, records: Sequence[Record], *, run_id: str, worker: str, day: date
) -> None:
    """Write a batch of outcomes in one transaction: consent state, outcome log, dead letters.

    Only rows still leased by ``worker`` are changed, so a late write from a worker whose
    lease expired cannot overwrite the newer owner's state.
    """
    if not records:
        return
    c = consents.c
    async with transaction(engine) as conn:
        done = [r for r in records if r.next_due_week is not None]
        if done:
            await conn.execute(
                update(consents)
                .where(c.id == bindparam("b_id"), c.lease_owner == worker)
                .values(
                    due_week=bindparam("b_due"),
                    last_scheduled_at=func.coalesce(bindparam("b_last", type_=UTCDateTime),
                                                    c.last_scheduled_at),
                    attempts=0, unknown_attempts=0, week_result=bindparam("b_result"),
                    pending_items=None,
                    last_error=bindparam("b_err"), lease_owner=None, lease_until=None,
                    updated_at=bindparam("b_at"),
                ),
                [
                    {"b_id": r.consent_id, "b_due": r.next_due_week,
                     "b_last": r.at if r.action == "done" else None,
                     "b_result": r.week_result, "b_err": r.error, "b_at": r.at}
                    for r in done
                ],
            )
        dead = [r for r in records if r.action == "dead_asset"]
        if dead:
            await conn.execute(
                update(consents)
                .where(c.id == bindparam("b_id"), c.lease_owner == worker)
                .values(status="dead", week_result="dead_asset", last_error=bindparam("b_err"),
                        pending_items=None,
                        lease_owner=None, lease_until=None, updated_at=bindparam("b_at")),
                [{"b_id": r.consent_id, "b_err": r.error, "b_at": r.at} for r in dead],
            )
        later = [r for r in records if r.next_due_week is None and r.action != "dead_asset"]
        if later:
            await conn.execute(
                update(consents)
                .where(c.id == bindparam("b_id"), c.lease_owner == worker)
                .values(
                    attempts=c.attempts + bindparam("b_inc", type_=Integer),
                    unknown_attempts=c.unknown_attempts + bindparam("b_uinc", type_=Integer),
                    not_before=func.coalesce(bindparam("b_nb", type_=UTCDateTime),
                                             c.not_before),
                    week_result=func.coalesce(bindparam("b_result", type_=String),
                                              c.week_result),
                    last_error=func.coalesce(bindparam("b_err", type_=String), c.last_error),
                    pending_items=bindparam("b_pending", type_=String),
                    lease_owner=None, lease_until=None, updated_at=bindparam("b_at"),
                ),
                [
                    {"b_id": r.consent_id, "b_inc": int(r.count_attempt),
                     "b_uinc": int(r.count_unknown), "b_nb": r.not_before,
                     "b_result": r.week_result, "b_err": r.error, "b_at": r.at,
                     "b_pending": r.pending_items}
                    for r in later
                ],
            )
        tokens = [r for r in records if r.new_access_token is not None]
        if tokens:
            await conn.execute(
                update(consents).where(c.id == bindparam("b_id")).values(
                    access_token=bindparam("b_tok"),
                    refresh_token=func.coalesce(bindparam("b_rtok", type_=String),
                                                c.refresh_token),
                ),
                [{"b_id": r.consent_id, "b_tok": r.new_access_token,
                  "b_rtok": r.new_refresh_token} for r in tokens],
            )
        letters = [r for r in records if r.dead_letter]
        if letters:
            await conn.execute(insert(dead_letters), [
                {"consent_id": r.consent_id, "org_code": r.org_code,
                 "week_start": r.week_start or day, "attempts": r.attempts_total,
                 "last_error": r.error, "entered_at": r.at}
                for r in letters
            ])
        await conn.execute(insert(call_outcomes), [
            {"run_id": run_id, "consent_id": r.consent_id, "org_code": r.org_code, "day": day,
             "tran_id": r.tran_id, "kind": r.kind, "action": r.action, "rsp_code": r.rsp_code,
             "calls": r.calls, "elapsed_ms": r.elapsed_ms, "at": r.at}
            for r in records
        ])


async def attempted_today(engine: AsyncEngine, *, day: date) -> dict[str, int]:
    """Refreshes already attempted today per provider (a restarted run resumes from here)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(
            select(call_outcomes.c.org_code, func.count())
            .where(call_outcomes.c.day == day, call_outcomes.c.action != "not_attempted")
            .group_by(call_outcomes.c.org_code)
        )).all()
    return {str(org).strip(): int(n) for org, n in rows}


class WorkStore(Protocol):
    """What the dispatcher needs from the database (an in-memory twin serves unit tests)."""

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: Cursor = START,
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]: ...

    async def release(self, ids: Sequence[int], *, worker: str) -> int: ...

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int: ...

    async def write(self, records: Sequence[Record], *, run_id: str, worker: str,
                    day: date) -> None: ...


class SqlWorkStore:
    """The real store: the functions above over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: Cursor = START,
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]:
        return await claim(self.engine, org_code, worker=worker, week=week, now=now,
                           limit=limit, after=after, lease=lease)

    async def release(self, ids: Sequence[int], *, worker: str) -> int:
        return await release(self.engine, ids, worker=worker)

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int:
        return await extend(self.engine, ids, worker=worker, until=until)

    async def write(self, records: Sequence[Record], *, run_id: str, worker: str,
                    day: date) -> None:
        await write_records(self.engine, records, run_id=run_id, worker=worker, day=day)
