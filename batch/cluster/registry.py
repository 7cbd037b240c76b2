"""The worker registry: who is in the cluster, who is alive, what each one holds.

Each ``run`` is a row of ``nodes`` (batch/db/nodes.py hands out the number; sql/008 adds the
registry's columns). A worker heartbeats every few seconds; it is dead once its last
heartbeat is older than the timeout it registered with, judged on the database server's
clock (PostgreSQL ``now()``; on SQLite, one machine, the caller's clock). A live worker
that sees a death expires the dead worker's leases at once, keeping their start marks: a
claim the dead worker had marked started comes back as an unknown outcome, one it only
held comes back plainly due (batch/db/work.py's claim decides that, as for any expired
lease).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.db import schema
from batch.db.engine import connect, transaction
from batch.db.nodes import fail_runs
from batch.lifecycle import Step

log = logging.getLogger("mydata.cluster")

#: an expired lease: earlier than any worker's clock, so the claim is due at once
EXPIRED = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Worker:
    """One registry row as seen at ``seen_at`` (the judging clock)."""

    node_id: int
    worker_id: str
    host: str
    pid: int
    run_id: str | None
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    dead_seen_at: datetime | None
    cluster: bool
    heartbeat_timeout: float
    alive: bool
    #: consents leased by this worker (held or in flight), and of those marked started
    claims: int = 0
    started: int = 0

    def __post_init__(self) -> None:
        if self.node_id < 1:
            raise ValueError("node_id must be >= 1")
        if self.heartbeat_timeout <= 0:
            raise ValueError("heartbeat_timeout must be positive")

    @property
    def state(self) -> str:
        return "stopped" if self.stopped_at is not None else "live" if self.alive else "dead"


async def _server_now(conn: AsyncConnection, now: datetime) -> datetime:
    if conn.dialect.name != "postgresql":
        return now
    got = (await conn.execute(text("SELECT now()"))).scalar_one()
    assert isinstance(got, datetime)
    return got


def _aware(v: datetime) -> datetime:
    return v if v.tzinfo is not None else v.replace(tzinfo=UTC)


def _alive(row: Any, at: datetime) -> bool:
    if row.stopped_at is not None:
        return False
    hb = _aware(row.heartbeat_at)
    return at - hb <= timedelta(seconds=float(row.heartbeat_timeout))


def _worker(row: Any, at: datetime, claims: int = 0, started: int = 0) -> Worker:
    r = row
    return Worker(
        node_id=int(r.node_id), worker_id=str(r.worker_id),
        host=str(r.host), pid=int(r.pid),
        run_id=r.run_id, started_at=_aware(r.started_at),
        heartbeat_at=_aware(r.heartbeat_at),
        stopped_at=r.stopped_at, dead_seen_at=r.dead_seen_at,
        cluster=bool(r.cluster),
        heartbeat_timeout=float(r.heartbeat_timeout), alive=_alive(r, at),
        claims=claims, started=started)


async def list_workers(engine: AsyncEngine, *, now: datetime, since: datetime | None = None,
                       ) -> list[Worker]:
    """Every worker that heartbeat since ``since`` (default: a day before now), live or
    dead, oldest first, with its claims."""
    n = schema.nodes.c
    c = schema.consents.c
    async with connect(engine) as conn:
        at = await _server_now(conn, now)
        floor = since if since is not None else at - timedelta(days=1)
        rows = (await conn.execute(select(schema.nodes).where(n.heartbeat_at >= floor)
                                   .order_by(n.started_at, n.node_id))).all()
        owners = sorted({str(r.worker_id) for r in rows})
        held: dict[str, tuple[int, int]] = {}
        if owners:
            for owner, total, started in (await conn.execute(
                    select(c.lease_owner, func.count(),
                           func.count(c.started_at))
                    .where(c.lease_owner.in_(owners)).group_by(c.lease_owner))).all():
                held[str(owner)] = (int(total), int(started))
    out = []
    for r in rows:
        alive = _alive(r, at)
        # claims belong to the newest row of a worker id that is alive, else the newest row
        total, started = held.get(str(r.worker_id), (0, 0))
        out.append(_worker(r, at, total, started) if alive or r.stopped_at is None
                   else _worker(r, at))
    return out


async def live_workers(engine: AsyncEngine, *, now: datetime) -> list[Worker]:
    """The live workers, oldest start first (node number breaks ties): the probe workers
    are the first and the last of this list."""
    n = schema.nodes.c
    async with connect(engine) as conn:
        at = await _server_now(conn, now)
        # a coarse filter in SQL (no timeout is above a day), the exact one per row
        rows = (await conn.execute(
            select(schema.nodes).where(n.stopped_at.is_(None),
                                       n.heartbeat_at >= at - timedelta(days=1))
            .order_by(n.started_at, n.node_id))).all()
    return [_worker(r, at) for r in rows if _alive(r, at)]


@dataclass(frozen=True, slots=True)
class Reaped:
    """A dead worker whose leases were expired: ``claims`` came back, ``started`` of them
    with a start mark (they come back as unknown outcomes)."""

    node_id: int
    worker_id: str
    claims: int
    started: int
    run_id: str | None = None


async def reap(engine: AsyncEngine, *, now: datetime, me: int) -> list[Reaped]:
    """Expire the leases of workers seen dead for the first time (not ``me``); each death is
    reaped once (``dead_seen_at``). A worker id still used by a live worker is not touched
    (its leases are the live one's)."""
    n = schema.nodes.c
    c = schema.consents.c
    out: list[Reaped] = []
    async with transaction(engine) as conn:
        at = await _server_now(conn, now)
        rows = (await conn.execute(
            select(schema.nodes).where(n.stopped_at.is_(None), n.dead_seen_at.is_(None),
                                       n.node_id != me)
            .with_for_update(skip_locked=True))).all()
        dead = [r for r in rows if not _alive(r, at)]
        if not dead:
            return []
        live_ids = {str(r.worker_id) for r in (await conn.execute(
            select(schema.nodes.c.worker_id, schema.nodes.c.heartbeat_at,
                   schema.nodes.c.heartbeat_timeout, schema.nodes.c.stopped_at)
            .where(n.stopped_at.is_(None)))).all() if _alive(r, at)}
        for r in dead:
            await conn.execute(update(schema.nodes).where(n.node_id == r.node_id)
                               .values(dead_seen_at=at))
            if r.run_id is not None:
                # its run would read "running" for ever (the dashboard, `check`): closed
                # here, failed; a worker only slow, not dead, overwrites it when it ends
                await conn.execute(fail_runs(
                    schema.runs.c.run_id == r.run_id, schema.runs.c.finished_at.is_(None),
                    at=at, reason=(f"worker {r.worker_id} seen dead (no heartbeat within "
                                   f"{float(r.heartbeat_timeout):g} s): its claims came "
                                   "back due")))
            if str(r.worker_id) in live_ids:
                continue
            counts = (await conn.execute(
                select(func.count(), func.count(c.started_at))
                .where(c.lease_owner == r.worker_id))).one()
            # the owner and the start mark stay: the next claim judges stale vs due
            await conn.execute(update(schema.consents).where(
                and_(c.lease_owner == r.worker_id,
                     or_(c.lease_until.is_(None), c.lease_until > EXPIRED)))
                .values(lease_until=EXPIRED))
            out.append(Reaped(int(r.node_id), str(r.worker_id), int(counts[0]),
                              int(counts[1]), r.run_id))
    for d in out:
        log.warning("worker seen dead: its claims are due again", extra={
            "action": "worker_dead", "node_id": d.node_id, "dead_worker": d.worker_id,
            "claims": d.claims, "started": d.started})
    return out


async def outcomes_of_run(engine: AsyncEngine, run_id: str, *, day: date) -> dict[str, int]:
    """Outcome rows a run wrote today per provider, the ones that used a start (not the
    "not attempted" ones, which were given back when they were written)."""
    co = schema.call_outcomes.c
    async with connect(engine) as conn:
        rows = (await conn.execute(
            select(co.org_code, func.count()).where(
                co.run_id == run_id, co.day == day, co.action != Step.NOT_ATTEMPTED.value)
            .group_by(co.org_code))).all()
    return {str(o).strip(): int(n) for o, n in rows}
