"""Benchmark: loading 1,000,000 consents, against a bare COPY of the same pre-parsed rows.

Run: ``pytest -s tests/bench/test_load_consents.py`` (MYDATA_BENCH_ROWS to change the size).
The baseline is asyncpg ``copy_records_to_table`` straight into ``consents`` (same indexes
and foreign key) of rows parsed beforehand (aware datetimes, tokens sealed), untimed, with
no validation, no staging and no upsert: what a plain bulk insert of these rows costs on
this machine. The sealing line is what encrypting the tokens costs inside the load.
"""

from __future__ import annotations

import os
import time
from datetime import date, datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.db import loaders
from batch.db.csv_input import CsvInput
from batch.db.engine import init_db, make_engine
from batch.db.tokens import check_tokens
from batch.seed import SeedParams, load_time, write_seed
from tests.sealing import CIPHER

ROWS = int(os.environ.get("MYDATA_BENCH_ROWS", "1000000"))
TODAY = date(2026, 11, 25)
NOW = load_time(TODAY, datetime(2026, 11, 25, 12, 0, tzinfo=KST))
_BASE_COLUMNS = ["user_id", "org_code", "access_token", "refresh_token", "consented_at",
                 "last_scheduled_at", "due_week", "not_before", "status", "updated_at"]


def _line(what: str, rows: int, seconds: float, baseline: float | None) -> str:
    ratio = f"{seconds / baseline:5.2f}x baseline" if baseline else "baseline"
    return f"{what:<48} {rows:>9} rows {seconds:7.2f} s {rows / seconds:>10,.0f} rows/s  {ratio}"


async def _fresh(url: str, files_inst: Path) -> AsyncEngine:
    from batch.config import load_institutions as read_toml

    engine = make_engine(url)
    await init_db(engine)
    await loaders.load_institutions(engine, read_toml(files_inst), now=NOW)
    return engine


async def test_load_consents_million(pg_url: str, sqlite_url: str, tmp_path: Path) -> None:
    t = time.perf_counter()
    seeded = write_seed(SeedParams(today=TODAY, providers=5, consents=ROWS), tmp_path)
    seed_s = time.perf_counter() - t
    path = seeded.files.consents
    mb = path.stat().st_size / 1e6
    print(f"\nwrote {ROWS} seeded consents ({mb:.0f} MB) in {seed_s:.1f} s")

    engine = await _fresh(pg_url, seeded.files.institutions)
    known = frozenset(p.org_code for p in seeded.providers)
    rows: list[tuple[str, str, str, str | None]] = []

    def seal(org_code: str, user_id: str, access: str,
             refresh: str | None) -> tuple[str, str | None]:
        rows.append((org_code, user_id, access, refresh))
        return CIPHER.seal_pair(org_code, user_id, access, refresh)

    with CsvInput(path, loaders.CONSENT_COLUMNS, loaders.CONSENT_OPTIONAL) as src:
        records = [
            (r[1], r[2], r[3], r[4], r[5].replace(tzinfo=KST),
             r[6] and r[6].replace(tzinfo=KST), r[7], r[8].replace(tzinfo=KST), "active", NOW)
            for chunk in loaders._parse_consents(src, known, NOW, as_text=False, seal=seal)
            for r in chunk
        ]
    # What sealing the tokens costs inside load_consents (two tokens a row, one key, each
    # bound to its row and column).
    tokens = sum(1 if r is None else 2 for _o, _u, _a, r in rows)
    t = time.perf_counter()
    for org, user, access, refresh in rows:
        CIPHER.seal_pair(org, user, access, refresh)
    seal_s = time.perf_counter() - t
    rows.clear()
    out = []
    try:
        async with engine.begin() as conn:
            raw = await conn.get_raw_connection()
            t = time.perf_counter()
            await raw.driver_connection.copy_records_to_table(
                "consents", records=records, columns=_BASE_COLUMNS)
            base = time.perf_counter() - t
        del records
        out.append(_line("baseline: COPY pre-parsed rows (PostgreSQL)", ROWS, base, None))
        out.append(_line(f"sealing {tokens} tokens (AES-256-GCM, v2)", ROWS, seal_s, base))
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE consents, dead_letters"))
        t = time.perf_counter()
        n = await loaders.load_consents(engine, path, now=NOW, cipher=CIPHER)
        out.append(_line("load_consents, empty table (PostgreSQL)", n,
                         time.perf_counter() - t, base))
        t = time.perf_counter()
        n = await loaders.load_consents(engine, path, now=NOW, cipher=CIPHER)
        out.append(_line("load_consents, re-load = upsert (PostgreSQL)", n,
                         time.perf_counter() - t, base))
        t = time.perf_counter()
        await check_tokens(engine, CIPHER)  # what `run` and every load start with
        out.append(_line("stored-token key check (PostgreSQL)", n, time.perf_counter() - t,
                         base))
    finally:
        await engine.dispose()

    engine = await _fresh(sqlite_url, seeded.files.institutions)
    try:
        t = time.perf_counter()
        n = await loaders.load_consents(engine, path, now=NOW, cipher=CIPHER)
        out.append(_line("load_consents, empty table (SQLite; vs PG base)", n,
                         time.perf_counter() - t, base))
    finally:
        await engine.dispose()
    print("\n".join(out))
    assert n == ROWS
