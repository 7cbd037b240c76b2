"""Shared fixtures: a fresh database on each backend, services required in CI, and a token
key for every test (tokens are encrypted at rest)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.crypto import KEY_FILE_ENV, KEYS_ENV, TokenCipher, generate_key
from batch.db.engine import init_db, make_engine

PG_ADMIN_URL = os.environ.get(
    "MYDATA_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)

def _xdist_index() -> int:
    """This pytest-xdist worker's number (gw0 -> 0; 0 when not distributed)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


# Each xdist worker flushes and uses its own Redis database (15, 14, ...): a test's
# flushdb must never wipe another worker's cluster state.
REDIS_URL = os.environ.get("MYDATA_TEST_REDIS_URL",
                           f"redis://127.0.0.1:6379/{15 - _xdist_index() % 12}")
REQUIRE_SERVICES = os.environ.get("MYDATA_REQUIRE_SERVICES") == "1"

# One generated key for the whole session, in the environment, so the console script and
# every other subprocess a test starts (they inherit it) seal and open with the same key as
# the test itself. Never the developer's own keys.
os.environ[KEYS_ENV] = generate_key()
os.environ.pop(KEY_FILE_ENV, None)


def _unavailable(what: str, exc: BaseException) -> None:
    msg = f"{what} unavailable: {exc}"
    if REQUIRE_SERVICES:
        pytest.fail(msg + " (MYDATA_REQUIRE_SERVICES=1: integration tests must run)")
    pytest.skip(msg)


async def _admin(sql: str) -> None:
    import asyncpg

    dsn = PG_ADMIN_URL.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
def token_cipher() -> TokenCipher:
    """The cipher of the session's key (what the CLI builds from the environment)."""
    return TokenCipher.from_env()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"mydata_t_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        _unavailable("PostgreSQL", exc)
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh, empty SQLite database (an empty file, as pg_url is an empty database:
    commands that only read refuse a file that does not exist)."""
    (tmp_path / "mydata.db").touch()
    return f"sqlite+aiosqlite:///{tmp_path / 'mydata.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database URL, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a freshly initialised database (both backends)."""
    eng = make_engine(db_url)
    await init_db(eng)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a freshly initialised PostgreSQL database (PostgreSQL-only tests)."""
    eng = make_engine(pg_url)
    await init_db(eng)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def redis_url() -> str:
    import redis

    try:
        r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        r.ping()
        r.flushdb()
        r.close()
    except Exception as exc:
        _unavailable("Redis", exc)
    return REDIS_URL


#: Tests that run subprocesses against a scaled real-time clock: under pytest-xdist (``make
#: test``) each group runs one test at a time on one worker, and both start first (they are
#: the longest). Several worker processes counted per second by the simulator ("cluster-
#: live"), and one run against its window ("realtime"): two of them side by side on two
#: cores fell behind their clock (a run that cannot keep up leaves work undone and exits 1).
SERIAL_GROUPS = {
    "cluster-live": (
        "tests/integration/test_cluster_live.py",
        "tests/integration/test_cluster_circuit_live.py",
        "tests/cluster/test_circuit_cluster.py",
    ),
    "realtime": (
        "tests/integration/test_sigterm.py",
        "tests/integration/test_crash_restart.py",
        "tests/integration/test_run_live.py",
        "tests/integration/test_window_change.py",
        "tests/integration/test_revoke_live.py",
        "tests/integration/test_run_observed.py",
        "tests/integration/test_chain_outage.py",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped: list[pytest.Item] = []
    for group, files in SERIAL_GROUPS.items():
        for item in items:
            if item.nodeid.startswith(files):
                item.add_marker(pytest.mark.xdist_group(group))
                grouped.append(item)
    if grouped and getattr(config.option, "numprocesses", None):
        chosen = set(map(id, grouped))
        items[:] = grouped + [i for i in items if id(i) not in chosen]
