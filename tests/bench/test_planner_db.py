"""The planner's database side at scale: 300 providers, 500,000 consents, on both databases.

Run: PYTHONPATH=$PWD python -m pytest -q -s tests/bench/test_planner_db.py

Prints the time and peak Python memory of ``build_week_plan`` (due classes counted with
GROUP BY in SQL) side by side with the naive baseline of fetching every due row into
Python, and the time of ``save_plan``.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from datetime import UTC, date, datetime, timedelta

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.planner import build_week_plan, save_plan
from planning.calendar import KST
from tests.bench.synthetic import consent_counts, usage_history

PROVIDERS = [f"BANK{i:06d}" for i in range(300)]
CONSENTS = 500_000
SUNDAY = date(2026, 11, 22)
T0 = datetime(2026, 11, 1, tzinfo=UTC)
CHUNK = 20_000


async def _populate(engine: AsyncEngine) -> None:
    rng = np.random.default_rng(5)
    counts = consent_counts(PROVIDERS, CONSENTS, seed=5)
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions), [
            dict(org_code=p, industry="bank", base_url="http://127.0.0.1:9001",
                 windows=json.dumps(["0000:0600"]), calls_per_second=float(rng.integers(5, 50)),
                 max_concurrency=10, options="{}", updated_at=T0) for p in PROVIDERS])
        usage = usage_history(PROVIDERS, SUNDAY - timedelta(days=182), SUNDAY, seed=5)
        await conn.execute(insert(schema.usage_daily), [
            dict(org_code=o, day=d, user_calls=int(n)) for o, d, n in
            zip(usage["org_code"], usage["date"], usage["user_calls"], strict=True)])
    rows = []
    uid = 0
    for p in PROVIDERS:
        for i in range(counts[p]):
            late = i % 17 == 0
            rows.append(dict(
                user_id=f"u{uid}", org_code=p, access_token="t", consented_at=T0,
                due_week=SUNDAY - timedelta(days=7) if i % 50 == 0 else SUNDAY,
                not_before=(datetime(2026, 11, 22 + i % 7, 9, tzinfo=KST) if late else T0),
                updated_at=T0))
            uid += 1
            if len(rows) == CHUNK:
                async with engine.begin() as conn:
                    await conn.execute(insert(schema.consents), rows)
                rows = []
    if rows:
        async with engine.begin() as conn:
            await conn.execute(insert(schema.consents), rows)


async def test_build_week_plan_at_scale_against_fetching_every_row(engine: AsyncEngine) -> None:
    t = time.perf_counter()
    await _populate(engine)
    load_s = time.perf_counter() - t
    now = datetime(2026, 11, 22, 0, 0, tzinfo=KST)

    # Timed without tracemalloc (it slows Python down several times), then traced once.
    t = time.perf_counter()
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=now)
    plan_s = time.perf_counter() - t
    tracemalloc.start()
    await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=now)
    plan_mem = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    c = schema.consents
    stmt = select(c.c.org_code, c.c.due_week, c.c.not_before).where(
        c.c.status == "active", c.c.due_week <= SUNDAY)
    t = time.perf_counter()
    async with engine.connect() as conn:
        fetched = (await conn.execute(stmt)).all()
    naive_s = time.perf_counter() - t
    del fetched
    tracemalloc.start()
    async with engine.connect() as conn:
        fetched = (await conn.execute(stmt)).all()
    naive_mem = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    t = time.perf_counter()
    await save_plan(engine, plan)
    save_s = time.perf_counter() - t
    async with engine.connect() as conn:
        n_minutes = (await conn.execute(select(func.count())
                                        .select_from(schema.plan_minutes))).scalar_one()

    placed = int(plan.days["batch_quota"].sum()) + sum(plan.unplaceable().values())
    print()
    print(f"[{engine.dialect.name}] {len(PROVIDERS)} providers, {CONSENTS:,} consents "
          f"(loaded in {load_s:.1f} s)")
    print(f"  build_week_plan (GROUP BY in SQL + forecast + quotas + minutes): "
          f"{plan_s:.2f} s, peak Python memory {plan_mem / 2**20:.1f} MiB")
    print(f"  baseline, only fetching every due row ({len(fetched):,}) into Python: "
          f"{naive_s:.2f} s, {naive_mem / 2**20:.1f} MiB (ours/baseline: time "
          f"{plan_s / naive_s:.2f}, memory {plan_mem / max(naive_mem, 1):.2f})")
    print(f"  save_plan: {save_s:.2f} s for {len(plan.days[plan.days['planned']]):,} day rows "
          f"and {n_minutes:,} minute rows")
    assert placed == CONSENTS
