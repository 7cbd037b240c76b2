"""Running the real ``mydata-batch`` console script as an operator would, and checking what
it leaves in the database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from batch.clock import KST
from batch.config import parse_institutions
from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.db.loaders import load_consents, load_institutions, load_usage
from tests.integration.helpers import subprocess_env
from tests.sealing import CIPHER

BIN = Path(sys.executable).with_name("mydata-batch")
#: A fixed time for every command: Tuesday 2026-12-01 12:00 KST (the week of 2026-11-29).
CLOCK = "speed=1;start=2026-12-01T12:00:00+09:00"

TOML = """\
operator_org_code = "OPERATOR01"

[[providers]]
org_code = "BANK000001"
industry = "bank"
base_url = "http://127.0.0.1:9001"
windows = ["0030:0530", "2200:2400"]
calls_per_second = 50
max_concurrency = 20

[[providers]]
org_code = "CARD000002"
industry = "card"
base_url = "http://127.0.0.1:9002"
windows = ["0000:0600"]
calls_per_second = 100
max_concurrency = 30
"""
CONSENTS = ("user_id,org_code,access_token,consented_at,last_scheduled_at,refresh_token\n"
            "u1,BANK000001,tok1,2026-01-01T00:00:00+09:00,2026-11-20T00:00:00+09:00,r1\n"
            "u2,CARD000002,tok2,2026-01-01T00:00:00+09:00,,r2\n"
            "u3,BANK000001,tok3,2026-01-01T00:00:00+09:00,,r3\n")
USAGE = "org_code,date,user_calls\nBANK000001,2026-11-01,1200\nCARD000002,2026-11-01,300\n"


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``mydata-batch ARGS`` in a subprocess (at the fixed time unless told)."""
    full_env = subprocess_env(**({"MYDATA_CLOCK": CLOCK} | env))
    if "MYDATA_DB_URL" not in env:
        full_env.pop("MYDATA_DB_URL", None)
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=120, check=False)


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return res


def refused(res: subprocess.CompletedProcess[str], *needles: str, lines: int = 1) -> str:
    """Exit 2, ``lines`` lines on stderr each ``mydata-batch: error: ...``, no traceback,
    and every needle in the message. Returns the message."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    err = res.stderr.strip().splitlines()
    assert len(err) == lines, res.stderr
    assert all(ln.startswith("mydata-batch: error: ") for ln in err), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for n in needles:
        assert n in res.stderr, (n, res.stderr)
    return res.stderr


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text, encoding="utf-8")
    return p


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=KST)  # CLOCK's time


def load_all(db: str, tmp: Path) -> None:
    """TOML, CONSENTS and USAGE loaded (in this process: setup, not the thing under test)."""
    async def go() -> None:
        engine = make_engine(db)
        try:
            await init_db(engine)
            await load_institutions(engine, parse_institutions(TOML), now=NOW)
            await load_consents(engine,
                                write(tmp, "consents.csv", CONSENTS), now=NOW, cipher=CIPHER)
            await load_usage(engine, write(tmp, "usage.csv", USAGE), now=NOW)
        finally:
            await engine.dispose()

    asyncio.run(go())


def snapshot(db: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to show a refused command changed nothing."""
    async def go() -> dict[str, list[tuple[Any, ...]]]:
        engine = make_engine(db)
        try:
            async with engine.connect() as conn:
                out = {}
                for t in schema.metadata.sorted_tables:
                    rows = (await conn.execute(select(t))).all()
                    out[t.name] = sorted((tuple(r) for r in rows), key=repr)
                return out
        finally:
            await engine.dispose()

    return asyncio.run(go())


def query(db: str, stmt: Any) -> list[Any]:
    async def go() -> list[Any]:
        engine = make_engine(db)
        try:
            async with engine.begin() as conn:
                res = await conn.execute(stmt)
                return list(res.all()) if res.returns_rows else []
        finally:
            await engine.dispose()

    return asyncio.run(go())
