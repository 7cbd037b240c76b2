"""``mydata-batch db reorder`` (PostgreSQL): the consents table rewritten in claim order,
ids and everything that refers to them unchanged, all or nothing; refused while a run or a
worker is alive, or when the table stays in use."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import work
from batch.db.engine import init_db, make_engine
from batch.db.nodes import register_node
from batch.db.reorder import reorder_consents
from batch.db.runlock import RunLocked, run_lock
from batch.errors import InputError
from tests.cli.console import cli, ok, refused
from tests.db.test_claims_together import NOW, ORGS, WEEK, seed_interleaved


async def _seed(engine: AsyncEngine, n: int) -> None:
    """Providers interleaved id by id (a file that mixed them, loaded before version 10),
    two due weeks, a dead asset on some."""
    await seed_interleaved(engine, n)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE consents SET due_week = :wk WHERE id % 5 = 0"),
                           {"wk": WEEK - timedelta(days=7)})
        await conn.execute(text(
            "INSERT INTO dead_assets (consent_id, item_id, since) "
            "SELECT id, 'acct-' || id, now() FROM consents WHERE id % 7 = 0"))


async def _by_place(engine: AsyncEngine) -> list[tuple[str, date, int, str]]:
    async with engine.connect() as conn:
        return [(str(r[0]).strip(), r[1], int(r[2]), str(r[3])) for r in await conn.execute(
            text("SELECT org_code, due_week, id, user_id FROM consents ORDER BY ctid"))]


async def test_reorder_writes_each_providers_consents_together_in_claim_order(
        pg: AsyncEngine) -> None:
    await _seed(pg, 600)
    before = await _by_place(pg)
    assert [r[0] for r in before[:3]] == list(ORGS)  # interleaved
    async with pg.connect() as conn:
        dead = (await conn.execute(text(
            "SELECT count(*) FROM dead_assets d JOIN consents c ON c.id = d.consent_id")
        )).scalar_one()
    done = await reorder_consents(pg)
    after = await _by_place(pg)
    assert done.rows == 600 and done.bytes_after > 0
    assert after == sorted(before)  # (provider, due week, id): the claim's keyset order
    async with pg.connect() as conn:
        assert (await conn.execute(text(
            "SELECT count(*) FROM dead_assets d JOIN consents c ON c.id = d.consent_id")
        )).scalar_one() == dead
        # the temporary index is gone; the claim's own is still used
        names = {r[0] for r in await conn.execute(text(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'consents'"))}
        assert "consents_reorder_tmp" not in names and "consents_due_idx" in names
    # a claim finds the same consents after it (the ids did not move)
    got = await work.claim(pg, ORGS[1], worker="w", week=WEEK, now=NOW, limit=1000)
    assert sorted(c.id for c in got) == sorted(r[2] for r in before if r[0] == ORGS[1])


async def test_reorder_is_refused_while_a_run_holds_the_database(pg: AsyncEngine) -> None:
    await _seed(pg, 30)
    before = await _by_place(pg)
    async with run_lock(pg):
        with pytest.raises(RunLocked, match="another run is already running"):
            await reorder_consents(pg)
    assert await _by_place(pg) == before


async def test_a_table_in_use_makes_reorder_give_up_with_nothing_changed(
        pg: AsyncEngine) -> None:
    await _seed(pg, 30)
    before = await _by_place(pg)
    async with pg.connect() as reader:
        await reader.execute(text("SELECT count(*) FROM consents"))  # holds its lock
        with pytest.raises(InputError, match=r"is in use .* held it for 0\.3 s\): nothing was"):
            await reorder_consents(pg, lock_timeout=0.3)
        await reader.rollback()
    assert await _by_place(pg) == before
    async with pg.connect() as conn:
        assert "consents_reorder_tmp" not in {r[0] for r in await conn.execute(text(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'consents'"))}


def test_the_cli_refuses_while_a_worker_is_alive_and_on_sqlite(pg_url: str,
                                                               sqlite_url: str) -> None:
    async def _setup() -> None:
        eng = make_engine(pg_url)
        try:
            await init_db(eng)
            await _seed(eng, 30)
        finally:
            await eng.dispose()

    asyncio.run(_setup())
    out = ok(cli("--db", pg_url, "db", "reorder")).stdout
    assert out.startswith("reordered 30 consents in ") and "MiB" in out

    async def _worker() -> None:
        eng = make_engine(pg_url)
        try:  # a worker heard from just now (by the server's clock, as the check reads it)
            await register_node(eng, worker_id="night-1", run_id="r", cluster=True,
                                now=datetime.now(UTC), heartbeat_timeout=3600)
        finally:
            await eng.dispose()

    asyncio.run(_worker())
    refused(cli("--db", pg_url, "db", "reorder"),
            "1 worker(s) alive", "night-1", "run it between runs")
    ok(cli("--db", sqlite_url, "db", "init"))
    refused(cli("--db", sqlite_url, "db", "reorder"), "db reorder is for PostgreSQL")
    refused(cli("--db", pg_url, "db", "reorder", "--lock-timeout", "0"), "--lock-timeout")
