"""One ``run`` per database at a time, unless cluster mode shares the work (``--redis``).

Two runs against one database would each run the whole plan: twice the calls, twice the
provider's rate. The lock is one a crash releases, so a kill -9 never leaves the database
locked: on PostgreSQL a session advisory lock held on a dedicated connection for the whole
run (the server drops it with the session); on SQLite an OS file lock (``flock``) on a file
beside the database (the kernel drops it with the process).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db.engine import connect, redact
from batch.errors import InputError, describe

log = logging.getLogger("mydata.run")

#: the advisory lock key of `run` (init_db's is 872634001)
RUN_LOCK_KEY = 872634002
#: cluster mode: the workers of one database make (or check) today's plan one at a time
PLAN_LOCK_KEY = 872634003


class RunLocked(InputError):
    """Another run holds the database."""


def _refused(engine: AsyncEngine, holder: str) -> RunLocked:
    who = f" ({holder})" if holder else ""
    return RunLocked(
        f"another run is already running on {redact(str(engine.url))}{who}: a second one "
        "would double the plan and the providers' rate; wait for it to finish")


@asynccontextmanager
async def run_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """Hold the database's run lock inside the block; RunLocked if another run has it."""
    if engine.dialect.name == "postgresql":
        async with _pg_lock(engine):
            yield
        return
    database = engine.url.database
    if not database or database == ":memory:":
        yield  # a private in-memory database: no other process can reach it
        return
    with _FileLock(engine, Path(database).with_name(Path(database).name + ".run-lock")):
        yield


@asynccontextmanager
async def _pg_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    async with connect(engine) as conn:
        got = (await conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                  {"key": RUN_LOCK_KEY})).scalar()
        await conn.commit()  # the lock is the session's: it outlives this transaction
        if not got:
            holder = (await conn.execute(text(
                "SELECT a.application_name || ' pid ' || l.pid FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                "AND l.objid = :key AND l.granted AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"key": RUN_LOCK_KEY})).scalar()
            raise _refused(engine, f"server process {holder.strip()}" if holder else "")
        try:
            yield
        finally:
            try:
                await conn.execute(text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": RUN_LOCK_KEY})
                await conn.commit()
            except Exception as exc:
                # The session is gone (a server restart, its backend killed): the server
                # dropped the lock with it. Or the unlock failed some other way: closing
                # the connection ends the session, which drops the lock. Either way the
                # run's own outcome stands (it was written and recorded on other
                # connections); it is not turned into an error at the very end.
                log.warning("run lock: its connection was lost; the lock went with it",
                            extra={"action": "run_lock_lost", "error": describe(exc)})
                await conn.invalidate()
            except BaseException:
                # never hand a connection that may still hold the lock back to the pool
                await conn.invalidate()
                raise


class _FileLock:
    """An exclusive ``flock`` on ``path``, which names the holder for the refusal."""

    def __init__(self, engine: AsyncEngine, path: Path) -> None:
        self._engine = engine
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip()
            os.close(fd)
            raise _refused(self._engine, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


@asynccontextmanager
async def plan_lock(engine: AsyncEngine, *, shared: bool) -> AsyncIterator[None]:
    """Cluster mode (``shared``): wait for the plan lock, so that many workers starting at
    once make today's plan once (the others find it fresh). A single run holds the run lock
    already: nothing to take. PostgreSQL only (SQLite's writers queue anyway)."""
    if not shared or engine.dialect.name != "postgresql":
        yield
        return
    async with connect(engine) as conn:
        await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PLAN_LOCK_KEY})
        await conn.commit()
        try:
            yield
        finally:
            try:
                await conn.execute(text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": PLAN_LOCK_KEY})
                await conn.commit()
            except BaseException:
                await conn.invalidate()
                raise
