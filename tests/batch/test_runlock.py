"""One `run` per database: a second concurrent run refuses to start with one line (exit 2);
a kill -9 of the first releases the lock. Real processes, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db.engine import make_engine
from batch.db.runlock import RunLocked, run_lock
from tests.integration.helpers import subprocess_env

# Holds the run lock until killed; with "wait", retries for a while first (after a kill -9
# the PostgreSQL server needs a moment to notice its client is gone).
HOLDER = """
import asyncio, sys, time
from batch.db.engine import make_engine
from batch.db.runlock import RunLocked, run_lock

async def main() -> None:
    engine = make_engine(sys.argv[1])
    give_up = time.monotonic() + (30 if sys.argv[2] == "wait" else 0)
    while True:
        try:
            async with run_lock(engine):
                print("locked", flush=True)
                await asyncio.Event().wait()
        except RunLocked:
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(0.2)

asyncio.run(main())
"""


def _hold(url: str, mode: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, url, mode], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=subprocess_env())
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until the lock is held (or the process died)
    if line.strip() != "locked":
        p.kill()
        raise AssertionError(f"holder did not get the lock: {p.stderr.read() if p.stderr else ''}")
    return p


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


@pytest.mark.integration
def test_a_second_run_on_the_same_database_is_refused_until_the_first_is_killed(
        db_url: str, procs: list[subprocess.Popen[str]]) -> None:
    first = _hold(db_url, "now")
    procs.append(first)
    second = subprocess.run([sys.executable, "-m", "batch.cli", "--db", db_url, "run"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "another run is already running" in lines[0], second.stderr
    assert "Traceback" not in second.stderr
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    procs.append(_hold(db_url, "wait"))  # a new run starts once the first is gone


async def test_the_lock_is_free_again_after_a_run_ends(db_url: str) -> None:
    engine: AsyncEngine = make_engine(db_url)
    try:
        async with run_lock(engine):
            with pytest.raises(RunLocked, match="another run is already running"):
                async with run_lock(engine):
                    pass
        async with run_lock(engine):  # released on exit
            pass
    finally:
        await engine.dispose()


def test_the_refusal_never_shows_a_password() -> None:
    engine = make_engine("postgresql+asyncpg://batch:s3cret@127.0.0.1:1/x")
    try:
        from batch.db.runlock import _refused

        message = str(_refused(engine, "server process 12"))
    finally:
        asyncio.run(engine.dispose())
    assert "s3cret" not in message and "127.0.0.1" in message


@pytest.mark.integration
async def test_a_run_lock_whose_connection_was_lost_ends_without_an_error(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The server ends the lock's session mid-run (a restart): the block's own outcome
    stands (no error at its very end, as the operator saw `run` exit 2 after a run that had
    recorded itself done), the loss is logged, and the lock can be taken again."""
    from tests.integration.helpers import kill_backends

    engine: AsyncEngine = make_engine(pg_url)
    try:
        async with run_lock(engine):
            assert await kill_backends(pg_url) >= 1
        assert any(getattr(r, "action", None) == "run_lock_lost" for r in caplog.records)
        async with run_lock(engine):  # the server dropped it with the session
            pass
    finally:
        await engine.dispose()


# --- a lock lost while its run goes on ---------------------------------------------------------

CHECK = 0.2  # seconds between the watch's checks in these tests


async def _lock_holders(url: str) -> list[int]:
    """The server processes holding the run lock of ``url``'s database."""
    import asyncpg

    from batch.db.runlock import RUN_LOCK_KEY

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.objid = $1 AND l.granted "
            "AND d.datname = $2", RUN_LOCK_KEY, url.rsplit("/", 1)[1])
    finally:
        await conn.close()
    return [int(r["pid"]) for r in rows]


async def _lose(url: str) -> None:
    """Make the held run lock lost: its PostgreSQL session ended (a restart would), or its
    lock file deleted (an operator's clean-up)."""
    if not url.startswith("postgresql"):
        lock_file(url).unlink()
        return
    import asyncpg

    (pid,) = await _lock_holders(url)
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()
    for _ in range(200):  # the server drops the lock as the session ends (and the watch
        if pid not in await _lock_holders(url):  # may have taken it again already)
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the ended session still holds the lock")


@contextlib.asynccontextmanager
async def _steal(url: str) -> AsyncIterator[None]:
    """Another run takes the held run lock, with no moment in which the first run's watch
    could take it back: on PostgreSQL it waits in the lock's queue before the holder's
    session is ended (the server hands the lock to the waiter); on SQLite a new, locked
    lock file replaces the old one in one rename."""
    if not url.startswith("postgresql"):
        path = lock_file(url)
        new = path.with_name(path.name + ".new")
        fd = os.open(new, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"pid {os.getpid()} on this host (the thief)\n".encode())
            os.replace(new, path)
            yield
        finally:
            os.close(fd)
        return
    import asyncpg

    from batch.db.runlock import RUN_LOCK_KEY

    (pid,) = await _lock_holders(url)
    thief = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        waiting = asyncio.ensure_future(thief.execute("SELECT pg_advisory_lock($1)",
                                                      RUN_LOCK_KEY))
        admin = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            for _ in range(200):  # queued behind the holder
                if await admin.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND objid = $1 AND NOT granted", RUN_LOCK_KEY):
                    break
                await asyncio.sleep(0.01)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        await waiting
        yield
    finally:
        await thief.close()


def lock_file(url: str) -> Path:
    db = Path(url.split("///", 1)[1])
    return db.with_name(db.name + ".run-lock")


async def _eventually(cond: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not within the time")


def _actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "action", "")) for r in caplog.records
            if str(getattr(r, "action", "")).startswith("run_lock")]


async def test_a_lost_run_lock_is_taken_again_and_keeps_a_second_run_out(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The server ended the lock's session (or the lock file was deleted) while the run goes
    on: the watch takes the lock again within a check, so a second run is still refused,
    and the run is not stopped."""
    engine: AsyncEngine = make_engine(db_url)
    other: AsyncEngine = make_engine(db_url)
    stopped: list[bool] = []
    try:
        async with run_lock(engine, on_lost=lambda: stopped.append(True), check_every=CHECK):
            await _lose(db_url)
            await _eventually(lambda: "run_lock_retaken" in _actions(caplog))
            with pytest.raises(RunLocked, match="another run is already running"):
                async with run_lock(other):
                    pass
        assert stopped == []
        assert _actions(caplog) == ["run_lock_lost", "run_lock_retaken"]
        async with run_lock(other):  # released at the end as ever
            pass
    finally:
        await engine.dispose()
        await other.dispose()


async def test_a_run_lock_another_run_took_while_it_was_lost_stops_this_run(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Another run got the lock first after the loss: this run is told to stop (``run``
    stops as on SIGTERM), once, the error names the holder, and the end of this run leaves
    the other run's lock alone."""
    engine: AsyncEngine = make_engine(db_url)
    third: AsyncEngine = make_engine(db_url)
    stopped: list[bool] = []
    try:
        async with contextlib.AsyncExitStack() as second_run:
            async with run_lock(engine, on_lost=lambda: stopped.append(True), check_every=CHECK):
                await second_run.enter_async_context(_steal(db_url))
                await _eventually(lambda: stopped == [True])
                await asyncio.sleep(3 * CHECK)  # told once, not at every check
                (taken,) = [r for r in caplog.records
                            if getattr(r, "action", None) == "run_lock_taken"]
                assert taken.levelno == logging.ERROR
                assert ("server process" in taken.getMessage() if db_url.startswith("postgres")
                        else "(the thief)" in taken.getMessage()), taken.getMessage()
            with pytest.raises(RunLocked):  # still the second run's
                async with run_lock(third):
                    pass
        assert stopped == [True]
        async with run_lock(third):  # and free once the second run ends
            pass
    finally:
        for e in (engine, third):
            await e.dispose()


async def test_a_lock_check_that_finds_the_database_down_tries_again_later(
        pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lost while the server cannot be reached (still restarting): one warning, then taken
    again as soon as the server answers."""
    from batch.db import runlock

    engine: AsyncEngine = make_engine(pg_url)
    real = runlock._PgHold.take
    down = [3]

    async def take(self: runlock._PgHold) -> str | None:
        if down[0] > 0:
            down[0] -= 1
            raise ConnectionRefusedError("connection refused (restarting)")
        return await real(self)

    try:
        async with run_lock(engine, check_every=CHECK):
            monkeypatch.setattr(runlock._PgHold, "take", take)
            await _lose(pg_url)
            await _eventually(lambda: "run_lock_retaken" in _actions(caplog))
        assert _actions(caplog) == ["run_lock_lost", "run_lock_retry", "run_lock_retaken"]
    finally:
        await engine.dispose()


@pytest.mark.integration
def test_a_run_whose_lock_another_run_took_stops_writes_everything_and_exits_3(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` against the simulator over HTTP; 50 s into its window another run takes its
    lock (the first one's lost in between). The first notices at its next check, stops as
    on SIGTERM (exit 3, status interrupted, the error line naming the other), gives its
    unstarted claims back and writes every outcome."""
    from batch.clock import KST
    from batch.simulator import SimulatorProcess
    from tests.integration.helpers import interrupted_run, leased_done_logged

    speed = 5.0
    run = interrupted_run(db_url, tmp_path, monkeypatch, speed=speed)
    clock, cmd = run.clock, run.cmd

    async def go() -> tuple[int, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            at = datetime(2026, 11, 30, 1, 0, 50, tzinfo=KST)
            await asyncio.sleep(max(0.0, (at - clock.now()).total_seconds() / speed))
            assert proc.returncode is None, "the run ended before its lock was taken"
            async with _steal(db_url):
                out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return proc.returncode, out, err

    with SimulatorProcess(run.toml, window_override=["0100:0102"]):
        code, out, err = asyncio.run(go())
    assert code == 3, err.decode()[-2000:]
    summary = json.loads(out)
    assert summary["status"] == "interrupted"
    (p,) = summary["providers"]
    assert 0 < p["attempted"] < 400  # stopped well before its window's end
    assert "run_lock_taken" in err.decode() or "another run took it" in err.decode()
    assert "Traceback" not in err.decode()

    leased, done, logged = leased_done_logged(db_url)
    assert leased == 0  # unstarted claims given back, finished ones written
    assert done == p["succeeded"] == logged


async def test_a_lock_check_that_fails_is_logged_and_the_run_goes_on(
        sqlite_url: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that cannot tell (the lock file unreadable) never ends the run with an error
    of its own: logged, tried again at the next check, the lock released at the end."""
    from batch.db import runlock

    engine: AsyncEngine = make_engine(sqlite_url)
    stopped: list[bool] = []

    async def unreadable(self: runlock._FileHold) -> bool:
        raise PermissionError("permission denied")

    try:
        async with run_lock(engine, on_lost=lambda: stopped.append(True), check_every=CHECK):
            monkeypatch.setattr(runlock._FileHold, "held", unreadable)
            await _eventually(lambda: _actions(caplog).count("run_lock_unchecked") >= 2)
        assert stopped == []
        async with run_lock(engine):  # released
            pass
    finally:
        await engine.dispose()
