"""The cluster section's reads (SQL): the worker processes (``nodes``) and each provider's
cluster circuit as last recorded (``circuit_events``), with the latest events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cluster.circuit_events import CircuitEvent, latest_per_provider, recent_events
from batch.db import schema
from batch.db.engine import connect


@dataclass(frozen=True, slots=True)
class WorkerRow:
    node_id: int
    worker_id: str
    host: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What the cluster section shows, read at ``read_at``."""

    read_at: datetime
    workers: tuple[WorkerRow, ...]
    circuits: dict[str, CircuitEvent]
    events: tuple[CircuitEvent, ...]


async def load_cluster(engine: AsyncEngine, *, now: datetime, workers: int = 50,
                       events: int = 20) -> ClusterState:
    """The latest ``workers`` nodes and ``events`` circuit events (none on an old schema)."""
    n = schema.nodes
    async with connect(engine) as conn:
        have = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        rows = [] if n.name not in have else (await conn.execute(
            select(n).order_by(n.c.started_at.desc(), n.c.node_id.desc()).limit(workers)
        )).mappings().all()
    found = tuple(WorkerRow(r["node_id"], r["worker_id"], r["host"], r["started_at"],
                            r["heartbeat_at"], r["stopped_at"]) for r in rows)
    if schema.circuit_events.name not in have:
        return ClusterState(now, found, {}, ())
    return ClusterState(now, found, await latest_per_provider(engine),
                        tuple(await recent_events(engine, limit=events)))
