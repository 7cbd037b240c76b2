"""One ``run`` per database at a time, unless cluster mode shares the work (``--redis``).

Two runs against one database would each run the whole plan: twice the calls, twice the
provider's rate. The lock is one a crash releases, so a kill -9 never leaves the database
locked: on PostgreSQL a session advisory lock held on a dedicated connection for the whole
run (the server drops it with the session); on SQLite an OS file lock (``flock``) on a file
beside the database (the kernel drops it with the process).

A lock can also be lost while its run goes on: a server restart ends the session, an
operator deletes the lock file. So a held lock is checked every few seconds and taken
again at once; if another run took it first, this one stops (``run_lock_taken``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.aio import cancel_and_wait
from batch.db.engine import connect, database_error, redact
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


#: how often a held run lock is checked (seconds): its PostgreSQL session still there, its
#: lock file still the one on disk; one lost is taken again, or the run stops
LOCK_CHECK_SECONDS = 5.0
#: a check that gets no answer in this long counts the session as lost
LOCK_CHECK_TIMEOUT = 30.0

#: who holds the run lock (for the refusal's line)
_HOLDER = text(
    "SELECT a.application_name || ' pid ' || l.pid FROM pg_locks l "
    "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
    "AND l.objid = :key AND l.granted AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())")


@asynccontextmanager
async def run_lock(engine: AsyncEngine, *, on_lost: Callable[[], None] | None = None,
                   check_every: float = LOCK_CHECK_SECONDS) -> AsyncIterator[None]:
    """Hold the database's run lock inside the block; RunLocked if another run has it.

    While the block runs, the lock is checked every ``check_every`` seconds. A PostgreSQL
    session that was lost (a server restart, its backend ended) took the lock with it, and
    a lock file deleted or replaced no longer keeps another run out: the lock is taken
    again at once. If another run got it first, ``run_lock_taken`` is logged as an error
    and ``on_lost`` is called (``run`` stops as on SIGTERM: two runs would double the plan
    and the providers' rate)."""
    if engine.dialect.name == "postgresql":
        hold: _Hold = _PgHold(engine)
    else:
        database = engine.url.database
        if not database or database == ":memory:":
            yield  # a private in-memory database: no other process can reach it
            return
        hold = _FileHold(engine, Path(database).with_name(Path(database).name + ".run-lock"))
    holder = await hold.take()
    if holder is not None:
        raise _refused(engine, holder)
    ending = asyncio.Event()
    watch = asyncio.get_running_loop().create_task(
        _watch(hold, on_lost, check_every, ending), name="run-lock-watch")
    try:
        yield
    finally:
        ending.set()  # a check under way ends first: the lock's connection is not shared
        try:
            await asyncio.shield(watch)
        except asyncio.CancelledError:
            await cancel_and_wait([watch])  # a check cut short: the release sees it lost
        await hold.release()


async def _watch(hold: _Hold, on_lost: Callable[[], None] | None, every: float,
                 ending: asyncio.Event) -> None:
    """Check the lock every ``every`` seconds until ``ending``; take a lost one again, or
    give up on it."""
    unreachable = False
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every):
                await ending.wait()
        if ending.is_set():
            return
        try:
            if await hold.held():
                continue
        except Exception as exc:  # cannot tell (the lock file unreadable): next time
            log.warning("run lock: could not be checked", extra={
                "action": "run_lock_unchecked", "error": describe(exc)})
            continue
        try:
            holder = await hold.take()
        except Exception as exc:  # the database is down: again at the next check
            if not unreachable:
                log.warning("run lock: lost, and cannot be taken again yet", extra={
                    "action": "run_lock_retry", "error": describe(exc)})
            unreachable = True
            continue
        unreachable = False
        if holder is None:
            log.warning("run lock: lost, and taken again", extra={"action": "run_lock_retaken"})
            continue
        log.error("run lock: another run took it while this run's hold was lost (%s); this "
                  "run stops, as two would double the plan and the providers' rate",
                  holder or "holder unknown",
                  extra={"action": "run_lock_taken", "holder": holder})
        if on_lost is not None:
            on_lost()
        return


class _Hold(Protocol):
    async def take(self) -> str | None:
        """Take the lock: None if taken, else who holds it (may be empty)."""
        ...

    async def held(self) -> bool:
        """Whether the lock is still ours (a lost one is logged and let go)."""
        ...

    async def release(self) -> None: ...


class _PgHold:
    """A session advisory lock on a connection of its own."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None

    async def take(self) -> str | None:
        try:
            conn = await self._engine.connect()
        except (OperationalError, DBAPIError, OSError) as exc:
            raise database_error(exc, str(self._engine.url)) from None
        try:
            got = (await conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                      {"key": RUN_LOCK_KEY})).scalar()
            await conn.commit()  # the lock is the session's: it outlives this transaction
            if got:
                self._conn = conn
                return None
            holder = (await conn.execute(_HOLDER, {"key": RUN_LOCK_KEY})).scalar()
            await conn.rollback()
        except BaseException as exc:
            await conn.invalidate()  # it may hold the lock: never back to the pool
            if isinstance(exc, (OperationalError, DBAPIError, OSError)):
                raise database_error(exc, str(self._engine.url)) from None
            raise
        await conn.close()
        return f"server process {holder.strip()}" if holder else ""

    async def held(self) -> bool:
        conn = self._conn
        if conn is None:
            return False
        try:
            async with asyncio.timeout(LOCK_CHECK_TIMEOUT):
                await conn.execute(text("SELECT 1"))
                await conn.rollback()
            return True
        except Exception as exc:
            self._conn = None
            await self._lost(conn, exc)
            return False

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return  # lost and not taken again: logged when it was
        try:
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": RUN_LOCK_KEY})
            await conn.commit()
        except Exception as exc:
            # The session is gone (a server restart, its backend killed): the server
            # dropped the lock with it. Or the unlock failed some other way: closing the
            # connection ends the session, which drops the lock. Either way the run's own
            # outcome stands (it was written and recorded on other connections); it is not
            # turned into an error at the very end.
            await self._lost(conn, exc)
        except BaseException:
            # never hand a connection that may still hold the lock back to the pool
            await conn.invalidate()
            raise
        else:
            await conn.close()

    @staticmethod
    async def _lost(conn: AsyncConnection, exc: BaseException) -> None:
        log.warning("run lock: its connection was lost; the lock went with it",
                    extra={"action": "run_lock_lost", "error": describe(exc)})
        with contextlib.suppress(Exception):
            await conn.invalidate()  # ends the session if it was still there


class _FileHold:
    """An exclusive ``flock`` on ``path``, which names the holder for the refusal."""

    def __init__(self, engine: AsyncEngine, path: Path) -> None:
        self._engine = engine
        self._path = path
        self._fd = -1

    async def take(self) -> str | None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip()
            os.close(fd)
            return holder
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._close()  # a lock on a file no longer on disk keeps nobody out
        self._fd = fd
        return None

    async def held(self) -> bool:
        """The locked file is still the one at ``path`` (not deleted, not replaced)."""
        try:
            on_disk = os.stat(self._path)
        except FileNotFoundError:
            on_disk = None
        ours = os.fstat(self._fd)
        if on_disk is not None and (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev,
                                                                        ours.st_ino):
            return True
        log.warning("run lock: its file %s was deleted or replaced", self._path,
                    extra={"action": "run_lock_lost", "path": str(self._path)})
        return False

    async def release(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


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
