"""Building blocks for the live tests: free ports, a small population, a saved plan."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, ScaledClock
from batch.config import Institutions, parse_institutions
from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.db.loaders import load_institutions
from planning.calendar import week_start
from tests.sealing import seal

DAY = date(2026, 11, 30)  # a Monday
WEEK = week_start(DAY)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port_run(n: int) -> int:
    """The first of ``n`` consecutive ports free on 127.0.0.1 (``run --processes n
    --metrics-port P`` serves P to P+n-1)."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + n > 65536:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def institutions_toml(ports: list[int], *, cps: int = 100, industries: tuple[str, ...] = (
        "bank", "card")) -> str:
    lines = ['operator_org_code = "OPERATOR01"']
    for i, (port, ind) in enumerate(zip(ports, industries, strict=False)):
        lines += [
            "[[providers]]",
            f'org_code = "{ind.upper()[:4]:X<4}{i:06d}"',
            f'industry = "{ind}"',
            f'base_url = "http://127.0.0.1:{port}"',
            'windows = ["0000:0600"]',
            f"calls_per_second = {cps}",
            "max_concurrency = 20",
        ]
    return "\n".join(lines) + "\n"


def make_institutions(ports: list[int], **kw: object) -> Institutions:
    return parse_institutions(institutions_toml(ports, **kw))  # type: ignore[arg-type]


async def populate(engine: AsyncEngine, insts: Institutions, *, per_provider: int,
                   now: datetime, quota: int | None = None) -> dict[str, list[str]]:
    """Institutions, ``per_provider`` consents due this week each, and today's plan rows.
    Returns the plain access tokens per provider (stored sealed, as the loader does)."""
    await load_institutions(engine, insts, now=now)
    tokens: dict[str, list[str]] = {}
    async with engine.begin() as conn:
        for p in insts.providers:
            toks = [f"tok-{p.org_code}-{i:05d}" for i in range(per_provider)]
            tokens[p.org_code] = toks
            await conn.execute(insert(schema.consents), [
                {"user_id": f"user{i}", "org_code": p.org_code,
                 "access_token": seal(t, p.org_code, f"user{i}"),
                 "refresh_token": seal(f"r{t}", p.org_code, f"user{i}", "refresh_token"),
                 "consented_at": now - timedelta(days=40),
                 "last_scheduled_at": now - timedelta(days=7), "due_week": WEEK,
                 "not_before": now - timedelta(days=40), "updated_at": now}
                for i, t in enumerate(toks)
            ])
            await conn.execute(insert(schema.plan_days).values(
                org_code=p.org_code, day=DAY, week_start=WEEK, forecast_user_calls=1000,
                batch_quota=per_provider if quota is None else quota, capacity=10**6,
                unplaceable=0, created_at=now))
    return tokens


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment (MYDATA_CLOCK included) with the checkout first on PYTHONPATH."""
    env = dict(os.environ, **extra)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def populate_url(db_url: str, insts: Institutions, *, per_provider: int,
                 now: datetime) -> dict[str, list[str]]:
    """:func:`populate` on a fresh database given by URL (for tests that run subprocesses)."""
    async def go() -> dict[str, list[str]]:
        engine = make_engine(db_url)
        try:
            await init_db(engine)
            return await populate(engine, insts, per_provider=per_provider, now=now)
        finally:
            await engine.dispose()

    return asyncio.run(go())


async def kill_backends(db_url: str) -> int:
    """Terminate every server process connected to ``db_url``'s PostgreSQL database (to a
    pool, a server restart); how many there were."""
    import asyncpg

    from tests.conftest import PG_ADMIN_URL

    name = db_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(PG_ADMIN_URL.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = $1 AND pid <> pg_backend_pid()", name)
    finally:
        await conn.close()
    await asyncio.sleep(0.1)  # the server closes the sockets
    return len(rows)



@dataclass(frozen=True)
class InterruptedRun:
    """A `run` of one bank's 400 consents over 01:00-01:02 at a ``speed``x clock from
    00:59:30, meant to be stopped part way (SIGTERM, its lock taken): the simulator's
    institutions file, the clock (in ``MYDATA_CLOCK`` already) and the command."""

    toml: Path
    clock: ScaledClock
    cmd: list[str]
    consents: int = 400


def interrupted_run(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                    speed: float) -> InterruptedRun:
    """Populate ``db_url`` and set the clock for an :class:`InterruptedRun`."""
    ports = free_ports(1)
    toml = tmp_path / "institutions.toml"
    toml.write_text(institutions_toml(ports, cps=50, industries=("bank",)))
    insts = make_institutions(ports, cps=50, industries=("bank",))
    clock = ScaledClock(speed, start=datetime(2026, 11, 30, 0, 59, 30, tzinfo=KST))
    populate_url(db_url, insts, per_provider=InterruptedRun.consents, now=clock.now())
    monkeypatch.setenv("MYDATA_CLOCK", clock.spec())
    cmd = [sys.executable, "-m", "batch.cli", "--db", db_url, "run", "--window-override",
           "0100:0102", "--json", "--progress", "none", "--log-level", "WARNING"]
    return InterruptedRun(toml, clock, cmd)


def leased_done_logged(db_url: str) -> tuple[int, int, int]:
    """After a run: consents still leased, consents done this week (due next week), and
    outcome rows."""
    async def go() -> tuple[int, int, int]:
        engine = make_engine(db_url)
        c = schema.consents.c
        try:
            async with engine.connect() as conn:
                leased = (await conn.execute(select(func.count()).where(
                    c.lease_owner.is_not(None)))).scalar_one()
                done = (await conn.execute(select(func.count()).where(
                    c.due_week == WEEK + timedelta(days=7)))).scalar_one()
                logged = (await conn.execute(select(func.count()).select_from(
                    schema.call_outcomes))).scalar_one()
            return int(leased), int(done), int(logged)
        finally:
            await engine.dispose()

    return asyncio.run(go())
