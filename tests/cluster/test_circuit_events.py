"""The coordinator's transitions recorded in PostgreSQL (server-clock times), and the
live-worker query on ``nodes`` by PostgreSQL's now()."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import SystemClock
from batch.cluster.circuit import CircuitSettings, Counts
from batch.cluster.circuit_events import live_workers, recent_events, transition_sink
from batch.cluster.circuit_redis import CircuitStore
from batch.cluster.coordinator import Coordinator
from batch.db import schema

pytestmark = pytest.mark.integration
ORG = "BANK000001"


async def test_coordinator_records_opens_and_closes_with_server_time(
        pg: AsyncEngine, redis_url: str) -> None:
    r = Redis.from_url(redis_url)
    try:
        s = CircuitStore(r, settings=CircuitSettings(minimum_calls=5, window_seconds=10,
                                                     bucket_seconds=1),
                         prefix="t:circuit:")
        c = Coordinator(s, candidate_id="w1", clock=SystemClock(),
                        on_transitions=transition_sink(pg))
        await c.tick()
        assert await recent_events(pg) == []  # closed with no calls: nothing to record
        await s.push({ORG: Counts(1, 9, 0)})
        await c.tick()
        await c.tick()  # still open: recorded once
        events = await recent_events(pg)
        assert [(e.org_code, e.state, e.source, e.actor, e.generation) for e in events] == [
            (ORG, "open", "coordinator", "w1", 1)]
        assert events[0].reason.startswith("failure rate 90% of 10 calls")
        server = datetime.fromtimestamp(await s.server_time(), UTC)
        assert abs((events[0].at - server).total_seconds()) < 5
    finally:
        await r.aclose()


async def test_live_workers_are_the_fresh_unstopped_nodes_oldest_first(
        pg: AsyncEngine) -> None:
    async with pg.begin() as conn:
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
        await conn.execute(insert(schema.nodes), [{"stopped_at": None, **row} for row in [
            {"worker_id": "newest", "host": "h", "pid": 1,
             "started_at": now - timedelta(minutes=1), "heartbeat_at": now},
            {"worker_id": "oldest", "host": "h", "pid": 2,
             "started_at": now - timedelta(hours=2), "heartbeat_at": now},
            {"worker_id": "dead", "host": "h", "pid": 3,
             "started_at": now - timedelta(hours=3), "heartbeat_at": now - timedelta(minutes=2)},
            {"worker_id": "left", "host": "h", "pid": 4,
             "started_at": now - timedelta(hours=4), "heartbeat_at": now,
             "stopped_at": now},
            {"worker_id": "middle", "host": "h", "pid": 5,
             "started_at": now - timedelta(hours=1), "heartbeat_at": now}]])
    assert await live_workers(pg, timeout=30) == ["oldest", "middle", "newest"]
