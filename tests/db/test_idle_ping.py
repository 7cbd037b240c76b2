"""PostgreSQL's pool pings a connection only after it sat unused (batch.db.engine.
_ping_when_idle), against a real server whose backends are killed under the pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import engine as engine_mod
from batch.db.engine import make_engine, transaction
from batch.errors import DatabaseError
from tests.integration.helpers import kill_backends

pytestmark = pytest.mark.integration


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pings asyncpg's adapted connections are asked for."""
    made: list[int] = []
    real = AsyncAdapt_asyncpg_connection.ping

    def counted(self: AsyncAdapt_asyncpg_connection) -> None:
        made.append(1)
        real(self)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "ping", counted)
    return made


async def _one(engine: AsyncEngine) -> int:
    async with transaction(engine) as conn:
        return int((await conn.execute(text("SELECT 1"))).scalar_one())


@pytest.fixture
async def pg_engine(pg_url: str, monkeypatch: pytest.MonkeyPatch
                    ) -> AsyncIterator[tuple[AsyncEngine, str]]:
    monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE", 0.3)
    eng = make_engine(pg_url)
    try:
        yield eng, pg_url
    finally:
        await eng.dispose()


async def test_a_connection_in_steady_use_is_not_pinged(
        pg_engine: tuple[AsyncEngine, str], pings: list[int]) -> None:
    eng, _ = pg_engine
    for _ in range(5):
        assert await _one(eng) == 1
    assert pings == []


async def test_an_idle_connection_is_pinged_and_a_dead_one_replaced(
        pg_engine: tuple[AsyncEngine, str], pings: list[int]) -> None:
    eng, url = pg_engine
    assert await _one(eng) == 1
    await asyncio.sleep(0.4)
    assert await _one(eng) == 1  # idle past the threshold: pinged, alive
    assert pings == [1]
    assert await kill_backends(url) >= 1
    await asyncio.sleep(0.4)
    assert await _one(eng) == 1  # pinged, dead, replaced: the caller never sees it
    assert len(pings) == 2


async def test_a_busy_connection_lost_fails_one_transaction_and_the_pool_recovers(
        pg_engine: tuple[AsyncEngine, str], pings: list[int]) -> None:
    eng, url = pg_engine
    # three connections in the pool, all recently used
    async with transaction(eng) as a, transaction(eng) as b, transaction(eng) as c:
        for conn in (a, b, c):
            await conn.execute(text("SELECT 1"))
    assert await kill_backends(url) >= 3
    with pytest.raises(DatabaseError):
        await _one(eng)  # not idle: not pinged; the lost connection fails this one
    # that failure made the pool drop every connection older than it: none fails again
    for _ in range(4):
        assert await _one(eng) == 1
    assert pings == []


async def test_an_explicit_pre_ping_is_the_pools_own(pg_url: str, pings: list[int]) -> None:
    eng = make_engine(pg_url, pool_pre_ping=True)
    try:
        for _ in range(3):
            assert await _one(eng) == 1
        assert len(pings) == 2  # every checkout but a new connection's first
    finally:
        await eng.dispose()
