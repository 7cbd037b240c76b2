"""How long one dashboard snapshot takes on PostgreSQL with weeks of outcome history.

Run: ``pytest -s tests/bench/test_dashboard.py`` (PostgreSQL on 127.0.0.1). Prints the
snapshot time beside a bare ``count(*)`` of the same week's outcomes (the unavoidable
floor) and their ratio. No timed assertion: the figures are for reading.
"""

from __future__ import annotations

import time
from datetime import date, datetime

from sqlalchemy import text

from batch.dashboard.data import load_snapshot
from batch.dashboard.render import render_page
from batch.db.engine import init_db, make_engine
from planning.calendar import KST

PER_WEEK = 1_000_000  # refreshes a week: the scale the product must handle
WEEKS = 6
PROVIDERS = 10
WEEK = date(2026, 11, 22)
NOW = datetime(2026, 11, 24, 3, 0, tzinfo=KST)


async def _fill(url: str) -> None:
    engine = make_engine(url)
    await init_db(engine)
    total = PER_WEEK * WEEKS
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO institutions (org_code, industry, base_url, windows, calls_per_second,"
            " max_concurrency, updated_at) SELECT 'ORG' || lpad(g::text, 7, '0'), 'bank',"
            " 'http://127.0.0.1:9', '[]', 50, 20, now()"
            f" FROM generate_series(1, {PROVIDERS}) g"))
        # written in time order, as the dispatcher writes them; one in ten not done
        await conn.execute(text(
            "INSERT INTO call_outcomes (run_id, consent_id, org_code, day, kind, action,"
            " calls, at) SELECT 'r', g, 'ORG' || lpad((g % 10 + 1)::text, 7, '0'),"
            f" date '2026-10-18' + (g::bigint * {WEEKS * 7} / ({total} + 1))::int, 'success',"
            " CASE WHEN g % 10 = 0 THEN 'retry_later' ELSE 'done' END, 3, now()"
            f" FROM generate_series(1, {total}) g"))
        await conn.execute(text(
            "INSERT INTO plan_days (org_code, day, week_start, forecast_user_calls,"
            " batch_quota, capacity, created_at) SELECT org_code, date '2026-11-22' + d,"
            " date '2026-11-22', 100000,"
            f" {PER_WEEK // PROVIDERS // 7}, 500000, now()"
            " FROM institutions, generate_series(0, 6) d"))
        await conn.execute(text(
            "INSERT INTO plan_minutes (org_code, day, minute, target) SELECT org_code,"
            " date '2026-11-24', m, 10 FROM institutions, generate_series(0, 1439) m"))
    async with engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
    await engine.dispose()


async def test_snapshot_time_against_a_bare_count(pg_url: str) -> None:
    await _fill(pg_url)
    engine = make_engine(pg_url)
    try:
        snaps, renders = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            snap = await load_snapshot(engine, week=WEEK, now=NOW)
            t1 = time.perf_counter()
            render_page(snap)
            snaps.append(t1 - t0)
            renders.append(time.perf_counter() - t1)
        counts = []
        async with engine.connect() as conn:
            for _ in range(3):
                t0 = time.perf_counter()
                n = (await conn.execute(text(
                    "SELECT count(*) FROM call_outcomes WHERE day BETWEEN :a AND :b"),
                    {"a": WEEK, "b": date(2026, 11, 28)})).scalar_one()
                counts.append(time.perf_counter() - t0)
    finally:
        await engine.dispose()
    best_snap, best_count = min(snaps), min(counts)
    print(f"\n{WEEKS} weeks x {PER_WEEK:,} outcomes ({n:,} this week), {PROVIDERS} providers")
    print(f"snapshot (all queries) {best_snap * 1000:8.0f} ms   best of 3")
    print(f"render (HTML + SVG)    {min(renders) * 1000:8.0f} ms")
    print(f"bare count(*) of week  {best_count * 1000:8.0f} ms   baseline")
    print(f"ratio snapshot/count   {best_snap / best_count:8.2f}")
    assert sum(x.batch_done for x in snap.loads) > 0
