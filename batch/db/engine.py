"""Engines and schema creation for the two supported backends."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import create_engine, event, insert, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from batch.db import schema
from batch.errors import ConfigError, DatabaseError, describe

DEFAULT_DB_URL = "sqlite+aiosqlite:///mydata.db"
# The PostgreSQL schema: batch/db/sql links to the top-level sql/ in a checkout, and is
# the files themselves in a built wheel (pyproject.toml's package data).
SQL_DIR = Path(__file__).resolve().parent / "sql"


def normalise_url(url: str) -> str:
    """Accept the common spellings and pin the async drivers we ship."""
    url = url.strip()
    if url.startswith(("postgres://", "postgresql://")):
        url = "postgresql+asyncpg://" + url.split("://", 1)[1]
    elif url.startswith("sqlite:///") or url == "sqlite://":
        url = "sqlite+aiosqlite" + url[len("sqlite"):]
    elif "://" not in url:
        # A bare path means an SQLite file.
        url = f"sqlite+aiosqlite:///{url}"
    return url


def backend(url: str) -> str:
    """'sqlite' or 'postgresql'."""
    return make_url(normalise_url(url)).get_backend_name()


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(normalise_url(url)).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid url>"


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"database URL {url!r} is not a valid URL") from None
    name = parsed.get_backend_name()
    if name == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    if name == "postgresql":
        if parsed.drivername != "postgresql+asyncpg":
            raise ConfigError("PostgreSQL URLs must use the asyncpg driver "
                              "(postgresql+asyncpg://...)")
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 10)
        engine = create_async_engine(url, **kwargs)
        if not kwargs.get("pool_pre_ping"):
            _ping_when_idle(engine, PING_AFTER_IDLE)
        return engine
    raise ConfigError(f"unsupported database {name!r}: use sqlite or postgresql")


#: a pooled PostgreSQL connection unused this long (seconds) is pinged before it is used
PING_AFTER_IDLE = 5.0


def _ping_when_idle(engine: AsyncEngine, after: float) -> None:
    """Ping a pooled connection before use only if it sat unused ``after`` seconds or more;
    one that does not answer is replaced by a new one (the pool's own checkout retry).

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout, and asyncpg's ping is three
    round trips (BEGIN, an empty query, ROLLBACK): a 700-row claim paid them on top of its
    own four (BEGIN, SET LOCAL, the statement, COMMIT), and a one-statement transaction cost
    the client 0.68-0.77x the CPU without them (tests/bench/test_pool_ping.py, 2026-12-06:
    medians 993 -> 766 us one at a time, 809 -> 549 eight at a time; the 700-row claim's
    p50 16.78 -> 16.43 ms, 125 of each alternated). A connection in steady use needs no
    ping: if the server went away under it (a restart, a killed backend), its next
    transaction fails as any database error does (the producer claims again the next
    second, the writer keeps its batch and writes it again, a start mark's claims wait),
    and that failure makes the pool replace every connection made before it. An idle
    connection is where a restart, a firewall's or the server's idle timeout goes unseen,
    and a one-off transaction (the run's opening and its record) meets it: those still
    get the ping."""
    def checkin(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["mydata_idle_since"] = time.monotonic()

    def checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("mydata_idle_since", None)
        if since is None or time.monotonic() - since < after:
            return  # a new connection, or one in steady use
        try:
            dbapi_conn.ping()
        except Exception as exc:  # the pool makes a new connection and tries that
            raise DisconnectionError(f"idle connection lost: {describe(exc)}") from exc

    event.listen(engine.sync_engine, "checkin", checkin)
    event.listen(engine.sync_engine, "checkout", checkout)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _describe(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    return re.sub(r"\s+", " ", lines[0]) if lines else type(orig).__name__


#: What a command may do with an SQLite file that is not there yet.
MAY_CREATE = "create"
MUST_EXIST = "exist"


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL (None for PostgreSQL and in-memory SQLite)."""
    try:
        parsed = make_url(normalise_url(url))
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def check_sqlite_target(url: str, mode: str) -> None:
    """Refuse an SQLite URL that would silently create a stray empty file: a directory that
    does not exist (always), or a file that does not exist when ``mode`` is MUST_EXIST."""
    path = sqlite_path(url)
    if path is None:
        return
    if not path.parent.is_dir():
        raise DatabaseError(
            f"database {redact(url)}: directory {str(path.parent)!r} does not exist; "
            "check the --db URL (or MYDATA_DB_URL) or create the directory")
    if mode == MUST_EXIST and not path.exists():
        raise DatabaseError(
            f"database {redact(url)}: file {str(path)!r} does not exist; check the --db URL "
            "(or MYDATA_DB_URL), or create it: mydata-batch db init")


def _pg_target(url: str) -> tuple[str, str, str, str]:
    parsed = make_url(normalise_url(url))
    return (parsed.host or "localhost", str(parsed.port or 5432), parsed.username or "postgres",
            parsed.database or "postgres")


def database_error(exc: BaseException, url: str) -> DatabaseError:
    """One line for a database failure: what is wrong and what to run next."""
    where = f"database {redact(url)}"
    text_ = _describe(exc)
    orig = getattr(exc, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(exc, "sqlstate", None)
    is_pg = backend(url) == "postgresql"
    if sqlstate == "42P01" or "no such table" in text_:
        return DatabaseError(f"{where} has no mydata-batch schema ({text_}); "
                             "create it: mydata-batch db init")
    if "no such column" in text_ or sqlstate == "42703":
        return DatabaseError(f"{where} has an older schema ({text_}); "
                             "upgrade it: mydata-batch db init")
    if is_pg:
        host, port, user, db = _pg_target(url)
        if sqlstate == "3D000":
            return DatabaseError(f"{where}: {text_}; create it: createdb -h {host} -p {port} "
                                 f"-U {user} {db}, then: mydata-batch db init")
        if sqlstate == "28000" and "role" in text_:
            return DatabaseError(f"{where}: {text_}; create it: createuser -h {host} -p {port} "
                                 f"{user} (or put an existing user in the --db URL)")
        if sqlstate == "28P01":
            return DatabaseError(f"{where}: {text_}; check the user and password in the "
                                 "--db URL (or MYDATA_DB_URL)")
        if sqlstate == "42501":
            return DatabaseError(f"{where}: {text_}; grant the user access to the schema")
        if isinstance(exc, OSError):
            return DatabaseError(f"{where}: cannot reach the server at {host}:{port} "
                                 f"({text_}); is PostgreSQL running? (pg_isready -h {host} "
                                 f"-p {port})")
    elif "unable to open database file" in text_:
        return DatabaseError(f"{where}: {text_}; check the path in the --db URL and that "
                             "its directory exists and is writable")
    return DatabaseError(f"{where}: {text_}")


@asynccontextmanager
async def connect(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection with unreachable-database errors turned into one clear DatabaseError."""
    try:
        async with engine.connect() as conn:
            yield conn
    except (OperationalError, DBAPIError, OSError) as exc:
        raise database_error(exc, str(engine.url)) from None


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One transaction: everything inside commits together or not at all."""
    try:
        async with engine.begin() as conn:
            yield conn
    except (OperationalError, DBAPIError, OSError) as exc:
        raise database_error(exc, str(engine.url)) from None


_P = ParamSpec("_P")
_T = TypeVar("_T")

#: the one thread that runs this process's SQLite transactions (:func:`run_transaction`)
_sqlite_thread: ThreadPoolExecutor | None = None
_sqlite_thread_lock = threading.Lock()
#: each SQLite file engine's twin: the same file through the plain sqlite3 driver
_twins: WeakKeyDictionary[Engine, Engine] = WeakKeyDictionary()


def _sqlite_twin(engine: AsyncEngine) -> Engine | None:
    """The plain (synchronous) engine on ``engine``'s SQLite file, made once and disposed
    with it; None for PostgreSQL and in-memory SQLite (not shared between connections)."""
    twin = _twins.get(engine.sync_engine)
    if twin is None:
        if engine.dialect.name != "sqlite" or sqlite_path(str(engine.url)) is None:
            return None
        twin = create_engine(engine.url.set(drivername="sqlite"),
                             connect_args={"timeout": 30, "check_same_thread": False},
                             pool_size=1, max_overflow=0)
        event.listen(twin, "connect", _sqlite_pragmas)
        # what listens to the engine's statements and commits (a count, a trace) hears the
        # twin's too
        of = weakref.ref(engine.sync_engine)

        def statement(*args: Any) -> None:
            owner = of()
            if owner is not None:
                owner.dispatch.before_cursor_execute(*args)

        def commit(conn: Connection) -> None:
            owner = of()
            if owner is not None:
                owner.dispatch.commit(conn)

        event.listen(twin, "before_cursor_execute", statement)
        event.listen(twin, "commit", commit)
        _twins[engine.sync_engine] = twin
        event.listen(engine.sync_engine, "engine_disposed",
                     lambda _engine, twin=twin: twin.dispose())
    return twin


def _on_sqlite_thread() -> ThreadPoolExecutor:
    global _sqlite_thread
    with _sqlite_thread_lock:
        if _sqlite_thread is None:
            _sqlite_thread = ThreadPoolExecutor(1, thread_name_prefix="mydata-sqlite")
        return _sqlite_thread


def _in_transaction(twin: Engine, fn: Callable[..., _T], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> _T:
    with twin.begin() as conn:
        return fn(conn, *args, **kwargs)


async def run_transaction(engine: AsyncEngine, fn: Callable[Concatenate[Connection, _P], _T],
                          *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``fn(conn, *args, **kwargs)`` in one transaction: all of it commits or none of it,
    with unreachable-database errors made one clear DatabaseError, as :func:`transaction`.

    ``fn`` is synchronous. On an SQLite file it runs whole in one thread of this process, on
    the file's plain sqlite3 driver, and the event loop waits for it once: through
    aiosqlite, each statement, fetch, cursor and commit waited for the loop's next turn,
    and a saturated loop's turns made a three-statement claim hold the file for 290 ms at
    the median (a start mark 185 ms, an outcome flush 270 ms), while starts waited for
    those marks. On PostgreSQL (and in-memory SQLite) it runs on the async connection
    (``AsyncConnection.run_sync``: each statement still one round trip of the driver)."""
    twin = _sqlite_twin(engine)
    if twin is None:
        async with transaction(engine) as conn:
            return await conn.run_sync(fn, *args, **kwargs)
    try:
        return await asyncio.get_running_loop().run_in_executor(
            _on_sqlite_thread(), _in_transaction, twin, fn, args, kwargs)
    except (OperationalError, DBAPIError, OSError) as exc:
        raise database_error(exc, str(engine.url)) from None


def _sql_files() -> list[Path]:
    files = sorted(SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))
    if not files:
        raise DatabaseError(f"no schema files found in {SQL_DIR}")
    return files


async def init_db(engine: AsyncEngine) -> int:
    """Create or upgrade the schema; idempotent. Returns the schema version now in place."""
    if engine.dialect.name == "postgresql":
        async with transaction(engine) as conn:
            # One initialiser at a time across workers.
            await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(872634001)")
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            for f in _sql_files():
                # asyncpg runs a multi-statement script only unprepared, through its own API.
                await driver.execute(f.read_text(encoding="utf-8"))
        return schema.SCHEMA_VERSION
    async with transaction(engine) as conn:
        await conn.run_sync(schema.metadata.create_all)
        await conn.run_sync(_sqlite_add_missing_columns)
        # The SQLite twin of sql/002_hot_leases.sql for files made by version 1.
        await conn.exec_driver_sql("DROP INDEX IF EXISTS consents_lease_idx")
        have = set((await conn.execute(select(schema.schema_migrations.c.version))
                    ).scalars().all())
        for version in range(1, schema.SCHEMA_VERSION + 1):
            if version not in have:
                await conn.execute(insert(schema.schema_migrations).values(version=version))
    return schema.SCHEMA_VERSION


def _sqlite_add_missing_columns(conn: Any) -> None:
    """Bring an SQLite file made by an older version up to ``schema.metadata``: add each
    declared column the file lacks (SQLite's twin of the ``ALTER TABLE ... ADD COLUMN``
    lines in ``sql/``). A new column must be nullable or have a server default."""
    from sqlalchemy.schema import CreateColumn

    for table in schema.metadata.sorted_tables:
        have = {r[1] for r in conn.exec_driver_sql(f'PRAGMA table_info("{table.name}")')}
        for col in table.columns:
            if col.name not in have:
                ddl = CreateColumn(col).compile(dialect=conn.dialect)
                conn.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN {ddl}')


def db_url_from_env(explicit: str | None = None) -> str:
    return explicit or os.environ.get("MYDATA_DB_URL") or DEFAULT_DB_URL
