"""The worker registry on both databases: live and dead workers, their claims, and a dead
worker's claims coming back at once with the lifecycle's start-mark semantics."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cluster.registry import EXPIRED, list_workers, live_workers, reap
from batch.db import schema, work
from batch.db.nodes import heartbeat, register_node

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
WEEK = date(2026, 11, 29)


async def _seed(engine: AsyncEngine, n: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code="BANK000001", industry="bank", base_url="http://127.0.0.1:1",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=5, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"user_id": f"u{i}", "org_code": "BANK000001", "access_token": f"tok-{i}",
             "consented_at": NOW - timedelta(days=30), "due_week": WEEK,
             "not_before": NOW - timedelta(days=30), "updated_at": NOW}
            for i in range(n)])


async def _open_runs(engine: AsyncEngine, *run_ids: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.runs), [
            {"run_id": r, "day": WEEK, "worker_id": "w", "started_at": NOW, "status": "running"}
            for r in run_ids])


async def _runs(engine: AsyncEngine) -> dict[str, tuple[str, bool, str | None]]:
    """run id -> (status, finished, error)."""
    r = schema.runs.c
    async with engine.connect() as conn:
        return {row.run_id: (row.status, row.finished_at is not None, row.error)
                for row in await conn.execute(select(r.run_id, r.status, r.finished_at,
                                                     r.error))}


async def _age(engine: AsyncEngine, node: int, seconds: float) -> None:
    """Make a node's last heartbeat ``seconds`` old on the judging clock."""
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            at = (await conn.execute(select(func.now()))).scalar_one()
        else:
            at = NOW
        await conn.execute(update(schema.nodes).where(schema.nodes.c.node_id == node)
                           .values(heartbeat_at=at - timedelta(seconds=seconds)))


async def test_live_workers_are_ordered_by_start_and_a_silent_one_is_dead(
        engine: AsyncEngine) -> None:
    a = await register_node(engine, worker_id="a", run_id="r", now=NOW, cluster=True,
                            heartbeat_timeout=15)
    b = await register_node(engine, worker_id="b", run_id="r", now=NOW, cluster=True,
                            heartbeat_timeout=15)
    c = await register_node(engine, worker_id="c", run_id="r", now=NOW, cluster=True,
                            heartbeat_timeout=15)
    await heartbeat(engine, c, now=NOW, stopped=True)  # left cleanly
    assert [w.node_id for w in await live_workers(engine, now=NOW)] == [a, b]
    await _age(engine, a, 16)
    live = await live_workers(engine, now=NOW)
    assert [w.node_id for w in live] == [b]
    states = {w.node_id: w.state for w in await list_workers(engine, now=NOW)}
    assert states == {a: "dead", b: "live", c: "stopped"}


async def test_a_dead_workers_claims_come_back_at_once_started_ones_as_unknown(
        engine: AsyncEngine) -> None:
    await _seed(engine, 4)
    await _open_runs(engine, "r-dead", "r-me")
    dead = await register_node(engine, worker_id="dead", run_id="r-dead", now=NOW,
                               cluster=True, heartbeat_timeout=15)
    me = await register_node(engine, worker_id="me", run_id="r-me", now=NOW, cluster=True,
                             heartbeat_timeout=15)
    got = await work.claim(engine, "BANK000001", worker="dead", week=WEEK, now=NOW,
                           limit=4, lease=timedelta(minutes=10))
    await work.mark_started(engine, [got[0].id, got[1].id], worker="dead", at=NOW)
    held = {w.worker_id: (w.claims, w.started) for w in await list_workers(engine, now=NOW)}
    assert held["dead"] == (4, 2)
    # alive: nothing to reap, and its leases hold
    assert await reap(engine, now=NOW, me=me) == []
    assert await work.claim(engine, "BANK000001", worker="me", week=WEEK, now=NOW,
                            limit=4) == []
    await _age(engine, dead, 60)
    reaped = await reap(engine, now=NOW, me=me)
    assert [(r.worker_id, r.claims, r.started) for r in reaped] == [("dead", 4, 2)]
    assert await reap(engine, now=NOW, me=me) == []  # each death reaped once
    # its run does not read "running" for ever: closed as failed, saying why
    runs = await _runs(engine)
    assert runs["r-me"] == ("running", False, None)
    assert runs["r-dead"][:2] == ("failed", True)
    assert runs["r-dead"][2] == ("worker dead seen dead (no heartbeat within 15 s): its "
                                 "claims came back due")
    async with engine.connect() as conn:
        until = set((await conn.execute(select(schema.consents.c.lease_until))).scalars())
    assert {u.replace(tzinfo=UTC) if u.tzinfo is None else u for u in until} == {EXPIRED}
    # long before the lease's end, the claims are due again: the started ones stale
    back = await work.claim(engine, "BANK000001", worker="me", week=WEEK, now=NOW,
                            limit=4)
    assert sorted((c.id, c.stale) for c in back) == sorted(
        [(got[0].id, True), (got[1].id, True), (got[2].id, False), (got[3].id, False)])
    rows = {w.node_id: w for w in await list_workers(engine, now=NOW)}
    assert rows[dead].dead_seen_at is not None and rows[dead].state == "dead"


async def test_a_worker_id_reused_by_a_live_worker_keeps_its_leases(
        engine: AsyncEngine) -> None:
    await _seed(engine, 2)
    await _open_runs(engine, "r1", "r2")
    old = await register_node(engine, worker_id="w", run_id="r1", now=NOW, cluster=True,
                              heartbeat_timeout=15)
    await register_node(engine, worker_id="w", run_id="r2", now=NOW, cluster=True,
                        heartbeat_timeout=15)
    me = await register_node(engine, worker_id="me", run_id="r2", now=NOW, cluster=True,
                             heartbeat_timeout=15)
    await work.claim(engine, "BANK000001", worker="w", week=WEEK, now=NOW, limit=2)
    await _age(engine, old, 60)
    assert await reap(engine, now=NOW, me=me) == []
    # the dead one's run is over all the same; the live one's goes on
    runs = await _runs(engine)
    assert runs["r1"][:2] == ("failed", True) and runs["r2"] == ("running", False, None)
    assert await work.claim(engine, "BANK000001", worker="me", week=WEEK, now=NOW,
                            limit=2) == []
