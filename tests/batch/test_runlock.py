"""One `run` per database: a second concurrent run refuses to start with one line (exit 2);
a kill -9 of the first releases the lock. Real processes, on both backends."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

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
