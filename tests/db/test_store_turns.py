"""How the store's transactions meet the event loop (``SqlWorkStore``, batch/db/engine.py's
``run_transaction``): on an SQLite file each runs whole in one thread of this process, not
statement by statement through aiosqlite's thread, and no start mark or claim waits while
a write's rows are being made."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import aiosqlite.core
import pytest
from sqlalchemy import event, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema, work
from batch.db.engine import make_engine
from batch.errors import DatabaseError
from batch.lifecycle import Done, Refreshed
from tests.sealing import CIPHER

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
WEEK = date(2026, 11, 29)
ORG = "BANK000001"


async def _seed(engine: AsyncEngine, n: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code=ORG, industry="bank", base_url="http://127.0.0.1:1",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=5, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"user_id": f"u{i}", "org_code": ORG, "access_token": "sealed",
             "consented_at": NOW - timedelta(days=30), "due_week": WEEK,
             "not_before": NOW - timedelta(days=30), "updated_at": NOW}
            for i in range(n)])


def _done(ids: list[int]) -> list[Done]:
    return [Done(Refreshed(i, ORG, NOW, "success", "00000", None, 2, 5),
                 next_week=WEEK + timedelta(days=7)) for i in ids]


class _Statements:
    """The statements the engine's listeners hear, with the thread each ran on."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    def __call__(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        self.sent.append((" ".join(statement.split()), threading.get_ident()))

    def index(self, part: str) -> int:
        """The first statement holding ``part`` (PostgreSQL's start mark and writes are
        inside a ``WITH``)."""
        return next(k for k, (s, _) in enumerate(self.sent) if part in s)


@pytest.fixture
def heard(engine: AsyncEngine) -> Iterator[_Statements]:
    statements = _Statements()
    event.listen(engine.sync_engine, "before_cursor_execute", statements)
    try:
        yield statements
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", statements)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_an_sqlite_transaction_runs_whole_in_one_thread_not_through_aiosqlite(
        engine: AsyncEngine, heard: _Statements, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through aiosqlite each statement, fetch, cursor and commit waited for the loop's next
    turn (a saturated loop made a three-statement claim take 290 ms at the median)."""
    await _seed(engine, 20)
    heard.sent.clear()
    operations = 0
    real = aiosqlite.core.Connection._execute

    async def counted(self: aiosqlite.core.Connection, fn: object, *a: object,
                      **kw: object) -> object:
        nonlocal operations
        operations += 1
        return await real(self, fn, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(aiosqlite.core.Connection, "_execute", counted)
    commits: list[int] = []
    event.listen(engine.sync_engine, "commit", lambda _c: commits.append(1))
    store = work.SqlWorkStore(engine, CIPHER)
    claims = await store.claim(ORG, worker="w1", week=WEEK, now=NOW, limit=10)
    ids = [c.id for c in claims]
    assert await store.mark_started(ids[:5], worker="w1", at=NOW) == set(ids[:5])
    assert await store.extend(ids, worker="w1", until=NOW + timedelta(minutes=20)) == 10
    await store.apply(_done(ids[:5]), run_id="r", worker="w1", day=NOW.date())
    assert await store.release(ids[5:], worker="w1") == 5
    assert operations == 0
    # The engine's listeners still hear every statement and commit (benchmarks count them),
    # each statement from the one thread that is not the loop's.
    assert len(commits) == 5
    threads = {t for _, t in heard.sent}
    assert len(heard.sent) >= 8 and len(threads) == 1
    assert threads != {threading.get_ident()}
    async with engine.connect() as conn:
        done = (await conn.exec_driver_sql(
            "SELECT count(*) FROM consents WHERE due_week > ? AND lease_owner IS NULL",
            (WEEK.isoformat(),))).scalar_one()
        logged = (await conn.exec_driver_sql("SELECT count(*) FROM call_outcomes")).scalar_one()
    assert (done, logged) == (5, 5)


async def test_a_start_mark_does_not_wait_while_a_write_is_made(
        engine: AsyncEngine, heard: _Statements) -> None:
    """A flush's rows are made before its turn: a start mark asked meanwhile is sent first
    (it waited for the whole making, hundreds of milliseconds on a saturated loop)."""
    await _seed(engine, 400)
    store = work.SqlWorkStore(engine, CIPHER)
    claims = await store.claim(ORG, worker="w1", week=WEEK, now=NOW, limit=400)
    ids = [c.id for c in claims]
    heard.sent.clear()
    write = asyncio.create_task(store.apply(_done(ids[:300]), run_id="r", worker="w1",
                                            day=NOW.date()))
    await asyncio.sleep(0)  # the write has begun making its rows
    assert await store.mark_started(ids[300:], worker="w1", at=NOW) == set(ids[300:])
    await write
    assert heard.index("UPDATE consents SET started_at") < heard.index(
        "INSERT INTO call_outcomes")


async def test_a_file_without_the_schema_is_one_clear_error_from_the_stores_thread(
        sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        with pytest.raises(DatabaseError, match="has no mydata-batch schema") as err:
            await work.SqlWorkStore(engine, CIPHER).claim(
                ORG, worker="w1", week=WEEK, now=NOW, limit=10)
        assert "\n" not in str(err.value)
    finally:
        await engine.dispose()
