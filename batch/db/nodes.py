"""The node registry: each process that sends calls gets its number from the database.

The number is the node part of every ``x-api-tran-id`` the process sends (batch/tranid.py),
so two processes never share one: on either backend it is an autoincrement id, never handed
out twice, across hosts and restarts. The rows are the seed of the cluster's worker registry
(``heartbeat_at`` says who is alive; ``stopped_at`` who left cleanly).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Update, func, insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import transaction


def _clock_of(engine: AsyncEngine, now: datetime) -> Any:
    """The time a heartbeat is written with: the server's on PostgreSQL (shared state in
    cluster mode uses the server's clock), the caller's on SQLite (one machine)."""
    return func.now() if engine.dialect.name == "postgresql" else now


async def register_node(engine: AsyncEngine, *, worker_id: str, run_id: str | None,
                        now: datetime, cluster: bool = False,
                        heartbeat_timeout: float = 30.0) -> int:
    """A new node number for this process (>= 1, never returned before by this database).

    ``heartbeat_timeout``: seconds of the heartbeat's clock (see :func:`_clock_of`) after
    which a node that stopped heartbeating is dead (batch/cluster/registry.py)."""
    at = _clock_of(engine, now)
    async with transaction(engine) as conn:
        result = await conn.execute(insert(schema.nodes).values(
            worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(), run_id=run_id,
            started_at=at, heartbeat_at=at, cluster=cluster,
            heartbeat_timeout=heartbeat_timeout))
        node_id = result.inserted_primary_key[0] if result.inserted_primary_key else None
    if not isinstance(node_id, int):
        raise AssertionError("the database returned no node id")
    return node_id


def fail_runs(*where: ColumnElement[bool], at: datetime, reason: str) -> Update:
    """The statement closing the ``runs`` rows ``where`` selects as failed at ``at``, saying
    why (the dashboard shows a failed run's ``error``): a run that ended on an error, or
    one whose process was found dead (by the next run, or by a cluster peer)."""
    return update(schema.runs).where(*where).values(finished_at=at, status="failed",
                                                    error=reason)


async def heartbeat(engine: AsyncEngine, node_id: int, *, now: datetime,
                    stopped: bool = False) -> None:
    """Say the node is alive at ``now`` (and, with ``stopped``, that it left cleanly)."""
    at = _clock_of(engine, now)
    values: dict[str, Any] = {"heartbeat_at": at}
    if stopped:
        values["stopped_at"] = at
    async with transaction(engine) as conn:
        await conn.execute(update(schema.nodes).where(schema.nodes.c.node_id == node_id)
                           .values(**values))
