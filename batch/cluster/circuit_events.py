"""The cluster circuit's history in the database, and the live-worker query the probe
designation needs until the worker registry (batch/cluster/registry.py) provides one.

Times are the Redis server's (the ``since`` of a decision or an override), never a
worker's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cluster.circuit import ProviderCircuit
from batch.cluster.coordinator import TransitionSink
from batch.db import schema
from batch.db.engine import connect, transaction


@dataclass(frozen=True, slots=True)
class CircuitEvent:
    """One row of ``circuit_events``."""

    at: datetime
    org_code: str
    state: str
    reason: str
    source: str  # "coordinator" | "operator"
    actor: str = ""
    generation: int | None = None
    failure_rate: float | None = None
    slow_rate: float | None = None
    calls: int | None = None


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def transition_sink(engine: AsyncEngine) -> TransitionSink:
    """What the coordinator records its opens and closes with (``on_transitions=``)."""
    async def record(moves: Sequence[tuple[ProviderCircuit | None, ProviderCircuit]],
                     actor: str) -> None:
        await record_events(engine, [CircuitEvent(
            at=_at(new.since), org_code=new.org_code, state=str(new.state), reason=new.reason,
            source="coordinator", actor=actor, generation=new.generation,
            failure_rate=new.failure_rate, slow_rate=new.slow_rate, calls=new.calls)
            for _old, new in moves])
    return record


async def record_events(engine: AsyncEngine, events: Sequence[CircuitEvent]) -> None:
    if not events:
        return
    async with transaction(engine) as conn:
        await conn.execute(insert(schema.circuit_events), [
            {"at": e.at, "org_code": e.org_code, "state": e.state, "reason": e.reason,
             "source": e.source, "actor": e.actor, "generation": e.generation,
             "failure_rate": e.failure_rate, "slow_rate": e.slow_rate, "calls": e.calls}
            for e in events])


async def recent_events(engine: AsyncEngine, *, org_code: str | None = None,
                        limit: int = 50) -> list[CircuitEvent]:
    """The latest events, newest first."""
    t = schema.circuit_events
    q = select(t).order_by(t.c.at.desc(), t.c.id.desc()).limit(limit)
    if org_code is not None:
        q = q.where(t.c.org_code == org_code)
    async with connect(engine) as conn:
        rows = (await conn.execute(q)).mappings().all()
    return [CircuitEvent(at=r["at"], org_code=r["org_code"], state=r["state"],
                         reason=r["reason"], source=r["source"], actor=r["actor"],
                         generation=r["generation"], failure_rate=r["failure_rate"],
                         slow_rate=r["slow_rate"], calls=r["calls"]) for r in rows]


async def latest_per_provider(engine: AsyncEngine) -> dict[str, CircuitEvent]:
    """Each provider's last event: its last known state, why and since when."""
    t = schema.circuit_events
    last = select(t.c.org_code, func.max(t.c.id).label("id")).group_by(t.c.org_code
                                                                       ).subquery()
    q = select(t).join(last, t.c.id == last.c.id)
    async with connect(engine) as conn:
        rows = (await conn.execute(q)).mappings().all()
    return {r["org_code"]: CircuitEvent(
        at=r["at"], org_code=r["org_code"], state=r["state"], reason=r["reason"],
        source=r["source"], actor=r["actor"], generation=r["generation"],
        failure_rate=r["failure_rate"], slow_rate=r["slow_rate"], calls=r["calls"])
        for r in rows}


#: PostgreSQL only (cluster mode is): the server's now(), never the caller's clock.
_LIVE = text("""
SELECT worker_id FROM nodes
WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => :timeout)
ORDER BY started_at, node_id
""")


async def live_workers(engine: AsyncEngine, *, timeout: float) -> list[str]:
    """The ``nodes`` that heartbeat within ``timeout`` seconds (by PostgreSQL's clock) and
    have not stopped, oldest first: the probe designation's input until the registry's
    ``live_workers()`` lands (then use that one)."""
    async with connect(engine) as conn:
        rows = (await conn.execute(_LIVE, {"timeout": float(timeout)})).all()
    return [str(r[0]) for r in rows]
