"""The node registry: every process gets a tran-id node number no other process had."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.db.nodes import heartbeat, register_node
from batch.tranid import TranIdGenerator

NOW = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)


async def test_two_processes_never_get_the_same_node_number(engine: AsyncEngine) -> None:
    a = await register_node(engine, worker_id="host-1", run_id="r1", now=NOW)
    b = await register_node(engine, worker_id="host-1", run_id="r1", now=NOW)
    assert a >= 1 and b > a
    ids_a = TranIdGenerator("OPERATOR01", node_id=a)
    ids_b = TranIdGenerator("OPERATOR01", node_id=b)
    # same counter, different node: never the same tran id
    assert {ids_a() for _ in range(3)}.isdisjoint({ids_b() for _ in range(3)})


async def test_a_restart_gets_a_new_number_even_after_rows_are_deleted(db_url: str) -> None:
    first = make_engine(db_url)
    await init_db(first)
    a = await register_node(first, worker_id="w", run_id=None, now=NOW)
    b = await register_node(first, worker_id="w", run_id=None, now=NOW)
    async with first.begin() as conn:
        await conn.execute(schema.nodes.delete().where(schema.nodes.c.node_id == b))
    await first.dispose()
    again = make_engine(db_url)  # a new process on the same database
    try:
        c = await register_node(again, worker_id="w", run_id=None, now=NOW)
    finally:
        await again.dispose()
    assert len({a, b, c}) == 3 and c > b


async def test_the_registry_row_names_the_process_and_takes_heartbeats(
        engine: AsyncEngine) -> None:
    import os
    import socket
    from datetime import timedelta

    node = await register_node(engine, worker_id="w-7", run_id="run-x", now=NOW)
    later = NOW + timedelta(minutes=5)
    await heartbeat(engine, node, now=later)
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.nodes).where(
            schema.nodes.c.node_id == node))).one()
    assert (row.worker_id, row.run_id, row.pid, row.host) == (
        "w-7", "run-x", os.getpid(), socket.gethostname())
    if engine.dialect.name == "postgresql":
        # cluster mode's shared state uses the server's clock, never a worker's
        assert row.heartbeat_at >= row.started_at
        assert abs(row.heartbeat_at - datetime.now(UTC)) < timedelta(minutes=5)
        assert row.stopped_at is None
    else:
        assert (row.started_at, row.heartbeat_at, row.stopped_at) == (NOW, later, None)
    await heartbeat(engine, node, now=later, stopped=True)
    async with engine.connect() as conn:
        stopped = (await conn.execute(select(schema.nodes.c.stopped_at).where(
            schema.nodes.c.node_id == node))).scalar_one()
    assert stopped is not None
    assert stopped == later or engine.dialect.name == "postgresql"
