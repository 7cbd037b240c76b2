"""`mydata-batch workers`: live, dead and stopped workers, their claims, their heartbeat."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, select, update

from batch.cli import main
from batch.db import schema, work
from batch.db.engine import init_db, make_engine
from batch.db.nodes import heartbeat, register_node
from tests.cluster.test_registry import WEEK, _seed

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)


def test_workers_lists_live_dead_and_stopped_with_their_claims(db_url: str) -> None:
    async def setup() -> None:
        engine = make_engine(db_url)
        try:
            await init_db(engine)
            await _seed(engine, 3)
            live = await register_node(engine, worker_id="live-1", run_id="r", now=NOW,
                                       cluster=True, heartbeat_timeout=3600)
            dead = await register_node(engine, worker_id="dead-1", run_id="r", now=NOW,
                                       cluster=True, heartbeat_timeout=15)
            gone = await register_node(engine, worker_id="gone-1", run_id="r", now=NOW,
                                       cluster=True, heartbeat_timeout=15)
            await heartbeat(engine, gone, now=NOW, stopped=True)
            await work.claim(engine, "BANK000001", worker="live-1", week=WEEK, now=NOW,
                             limit=2)
            async with engine.begin() as conn:
                at = ((await conn.execute(select(func.now()))).scalar_one()
                      if engine.dialect.name == "postgresql" else NOW)
                await conn.execute(update(schema.nodes)
                                   .where(schema.nodes.c.node_id == dead)
                                   .values(heartbeat_at=at - timedelta(minutes=5)))
                await conn.execute(update(schema.nodes)
                                   .where(schema.nodes.c.node_id == live)
                                   .values(heartbeat_at=at))
        finally:
            await engine.dispose()

    asyncio.run(setup())
    env = {"MYDATA_CLOCK": f"speed=1;start={NOW.isoformat()}"}
    res = CliRunner().invoke(main, ["--db", db_url, "workers", "--json"], env=env)
    assert res.exit_code == 0, res.output
    rows = {d["worker_id"]: d for d in map(json.loads, res.output.splitlines())}
    assert {k: v["state"] for k, v in rows.items()} == {
        "live-1": "live", "dead-1": "dead", "gone-1": "stopped"}
    assert (rows["live-1"]["claims"], rows["dead-1"]["claims"]) == (2, 0)
    table = CliRunner().invoke(main, ["--db", db_url, "workers"], env=env)
    assert table.exit_code == 0
    assert "1 live, 1 dead, 1 stopped" in table.output
    assert "live-1" in table.output and "last heartbeat" in table.output
