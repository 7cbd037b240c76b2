"""The live server over real HTTP on 127.0.0.1: page, JSON, loopback by default."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import main
from batch.clock import FakeClock
from batch.dashboard import server
from batch.dashboard.server import ServerSettings, bound_addresses, is_loopback
from batch.db import schema
from tests.dashboard.conftest import ACCESS, BANK, NOW, REFRESH, Tables, Week

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


async def test_server_binds_loopback_by_default_and_serves_page_and_json(week: Week) -> None:
    running = await server.start(week.engine, FakeClock(NOW),
                                 ServerSettings(port=0, refresh_seconds=7))
    try:
        assert bound_addresses(running) == ["127.0.0.1"]
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            page = await client.get("/")
            doc = await client.get("/api/summary.json")
    finally:
        await running.stop()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert '<meta http-equiv="refresh" content="7">' in page.text
    assert Tables(page.text).row(f"load-{BANK}", "Batch done", "consents")[:3] == ["4", "3", "1"]
    assert doc.status_code == 200 and doc.headers["content-type"].startswith("application/json")
    data = doc.json()
    assert data["week_start"] == "2026-11-29"
    bank = next(p for p in data["providers"] if p["org_code"] == BANK)
    assert [d["batch_done_consents"] for d in bank["days"]] == [4, 3, 1, 0, 0, 0, 0]
    assert [d["batch_planned_calls"] for d in bank["days"]][:2] == [27_000, 24_000]
    assert [d["user_plus_batch_planned_calls"] for d in bank["days"]][:2] == [39_345, 46_222]
    assert bank["calls_per_consent"] == 3.0
    assert {p["org_code"]: p["status"] for p in data["progress"]}[BANK] == "behind plan"
    for text in (page.text, doc.text):
        assert ACCESS not in text and REFRESH not in text


async def test_server_shows_another_week_on_request_and_refuses_a_bad_one(week: Week) -> None:
    running = await server.start(week.engine, FakeClock(NOW), ServerSettings(port=0))
    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            later = await client.get("/api/summary.json", params={"week": "2026-12-09"})
            bad = await client.get("/", params={"week": "soon"})
    finally:
        await running.stop()
    assert later.json()["week_start"] == "2026-12-06" and later.json()["has_plan"] is False
    assert bad.status_code == 400


async def test_empty_database_is_served_as_a_helpful_page(engine: AsyncEngine) -> None:
    running = await server.start(engine, FakeClock(NOW), ServerSettings(port=0))
    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            page = await client.get("/")
    finally:
        await running.stop()
    assert page.status_code == 200 and "No plan saved for this week" in page.text


def test_only_loopback_hosts_count_as_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.0.10")
    assert not is_loopback("example.com")


def test_cli_warns_before_binding_a_non_loopback_address(sqlite_url: str) -> None:
    # 192.0.2.1 is TEST-NET: never ours, so the bind fails after the warning and nothing
    # is ever exposed.
    result = CliRunner().invoke(main, ["--db", sqlite_url, "dashboard", "--serve",
                                       "--host", "192.0.2.1", "--port", "0"])
    assert "warning: binding to 192.0.2.1" in result.output
    assert result.exit_code == 2
    assert "cannot listen on 192.0.2.1" in result.output


@contextlib.contextmanager
def _serving(sqlite_url: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``dashboard --serve --port 0`` in a process of its own (faulthandler on): the process
    and its URL once it listens; killed on the way out if it is still running."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", "from batch.cli import main; main()",
         "--db", sqlite_url, "dashboard", "--serve", "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dashboard on http://127.0.0.1:"), line
        yield proc, line.split()[2]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _exit_code(proc: subprocess.Popen[str], after: str) -> int:
    """Its exit code within 15 s; if none, a failure with every thread's stack
    (faulthandler on SIGABRT)."""
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"no exit within 15 s of {after}; its output:\n{err[-8000:]}")


@pytest.mark.timeout(60)
def test_cli_serve_runs_until_interrupted(sqlite_url: str) -> None:
    with _serving(sqlite_url) as (proc, url):
        page = httpx.get(url, timeout=10)
        doc = httpx.get(url + "api/summary.json", timeout=10)
        assert page.status_code == 200 and "mydata-batch" in page.text
        assert doc.json()["has_plan"] is False
        proc.send_signal(signal.SIGINT)
        code = _exit_code(proc, "SIGINT")
        assert code == 0, proc.stderr.read() if proc.stderr else code


#: tgkill's system call number (Python has no tgkill: a signal to one thread of another process)
_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


@pytest.mark.skipif(sys.platform != "linux" or _SYS_TGKILL is None,
                    reason="tgkill is a Linux system call")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_serve_stops_on_a_signal_the_kernel_gives_another_thread(
        sqlite_url: str, sig: signal.Signals) -> None:
    """A signal to a process goes to any one of its threads. Given to SQLite's driver thread,
    asyncio.run's Ctrl-C handler never woke the loop sleeping in select(): the fresh-clone
    CI saw ``dashboard --serve`` ignore SIGINT three times in a row, under load."""
    import ctypes

    with _serving(sqlite_url) as (proc, url):
        assert httpx.get(url, timeout=10).status_code == 200  # SQLite opened
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "no thread besides the main one"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(_SYS_TGKILL, proc.pid, others[0], int(sig)) == 0
        assert _exit_code(proc, sig.name) == 0


async def test_live_page_links_only_to_other_weeks_of_itself(week: Week) -> None:
    running = await server.start(week.engine, FakeClock(NOW), ServerSettings(port=0))
    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            page = (await client.get("/")).text
    finally:
        await running.stop()
    assert re.findall(r'href="([^"]*)"', page) == [
        "?week=2026-11-22", "?week=2026-11-29", "?week=2026-12-06"]


async def test_snapshots_are_reused_for_cache_seconds_then_reread(week: Week) -> None:
    clock = FakeClock(NOW)
    running = await server.start(week.engine, clock, ServerSettings(port=0, cache_seconds=5))

    async def done_today(client: httpx.AsyncClient) -> int:
        doc = (await client.get("/api/summary.json")).json()
        return int(doc["total"]["days"][2]["batch_done_consents"])

    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            assert await done_today(client) == 3
            async with week.engine.begin() as conn:
                await conn.execute(insert(schema.call_outcomes).values(
                    run_id="run-2", consent_id=1, org_code=BANK, day=NOW.date(),
                    kind="success", action="done", at=NOW))
            assert await done_today(client) == 3  # cached
            clock.advance(5)
            assert await done_today(client) == 4
    finally:
        await running.stop()
