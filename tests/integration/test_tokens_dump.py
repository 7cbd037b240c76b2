"""Tokens at rest, end to end: consents loaded at the command line, a run over real HTTP
against a simulator that expires half the access tokens (so the run refreshes them), then a
full SQL dump of the database (SQLite ``iterdump``, PostgreSQL ``pg_dump``): no access or
refresh token from the file, and none the simulator handed out, in plain text."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from batch.clock import KST, ScaledClock
from batch.crypto import stored_key_id
from batch.db import schema
from batch.db.engine import make_engine
from batch.dispatch.runner import RunOptions, run_day
from batch.simulator import Behaviour, Scenario, Simulator
from planning.windows import parse_window
from tests.cli.console import cli, ok, write
from tests.integration.helpers import free_ports, institutions_toml, make_institutions
from tests.sealing import CIPHER, unseal

pytestmark = pytest.mark.integration
START = datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST)


def full_dump(db_url: str) -> str:
    """Every statement that rebuilds the database, as text."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.split(":///", 1)[1])
        try:
            return "\n".join(conn.iterdump())
        finally:
            conn.close()
    pg_dump = shutil.which("pg_dump")
    assert pg_dump, "pg_dump is needed for this test"
    url = db_url.replace("postgresql+asyncpg://", "postgresql://")
    return subprocess.run([pg_dump, "--no-owner", url], capture_output=True, text=True,
                          check=True, timeout=120).stdout


async def test_a_full_dump_after_a_load_and_a_run_holds_no_token(db_url: str,
                                                                  tmp_path: Path) -> None:
    ports = free_ports(2)
    insts = make_institutions(ports, cps=50)
    toml = write(tmp_path, "i.toml", institutions_toml(ports, cps=50))
    rows = [(f"u{i}", p.org_code, f"fileAT{p.org_code}{i:04d}x", f"fileRT{p.org_code}{i:04d}y")
            for p in insts.providers for i in range(40)]
    csv = write(tmp_path, "c.csv", "user_id,org_code,access_token,consented_at,"
                "last_scheduled_at,refresh_token\n" + "".join(
                    f"{u},{o},{a},2026-10-01T10:00:00+09:00,2026-11-24T02:00:00+09:00,{r}\n"
                    for u, o, a, r in rows))
    at_load = {"MYDATA_CLOCK": f"speed=1;start={(START - timedelta(minutes=5)).isoformat()}"}
    ok(cli("--db", db_url, "load", "institutions", str(toml), **at_load))
    ok(cli("--db", db_url, "load", "consents", str(csv), **at_load))

    clock = ScaledClock(10, start=START)
    window = parse_window("0100:0102", step=1)
    scenario = Scenario(defaults=Behaviour(latency_median_ms=0, expired_token_fraction=0.5))
    engine = make_engine(db_url)
    try:
        async with Simulator(insts, scenario, clock=clock, window_override=[window]):
            res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
                window_override=(window,), progress="none", lease=timedelta(minutes=5)),
                stream=io.StringIO(), install_signals=False)
        t = res.summary.totals
        assert t["planned"] > 0 and t["succeeded"] == t["planned"], res.summary.to_json()
        c = schema.consents.c
        async with engine.connect() as conn:
            stored = (await conn.execute(select(c.org_code, c.user_id, c.access_token,
                                                c.refresh_token))).all()
    finally:
        await engine.dispose()

    # Stored sealed; opened, some are the pairs the simulator handed out on refresh.
    assert all(stored_key_id(t) == CIPHER.primary_id for _o, _u, *pair in stored for t in pair)
    assert all(t.startswith("v2.") for _o, _u, *pair in stored for t in pair)
    # each opens on its own row and column (refreshed ones too: sealed bound by the store)
    opened = {unseal(a, o, u) for o, u, a, _r in stored} | {
        unseal(r, o, u, "refresh_token") for o, u, _a, r in stored}
    refreshed = {t for t in opened if t.startswith(("simA", "simR"))}
    assert refreshed, "the run refreshed no token: the test would prove nothing about them"

    dump = full_dump(db_url)
    assert "fileAT" not in dump and "fileRT" not in dump
    from_file = {t for _u, _o, a, r in rows for t in (a, r)}
    assert not [t for t in from_file | refreshed if t in dump]
    assert "INSERT INTO" in dump or "COPY " in dump  # the dump does hold the rows
