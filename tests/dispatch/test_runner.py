"""run_day's nightly re-plan: a plan saved before today is re-levelled; one saved today is kept."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, FakeClock
from batch.db import schema
from batch.dispatch.runner import RunOptions, run_day
from planning.windows import parse_window
from tests.integration.helpers import DAY, free_ports, make_institutions, populate

# An override window already over at 01:00: the run plans, then has nothing left to do.
PAST = (parse_window("0001:0002", step=1),)


async def _planned(engine: AsyncEngine) -> int:
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, tzinfo=KST))
    res = await run_day(engine, clock=clock, options=RunOptions(window_override=PAST,
                        progress="none"), stream=io.StringIO(), install_signals=False)
    (p,) = res.summary.to_json()["providers"]
    return int(p["planned"])


async def test_a_plan_saved_before_today_is_relevelled_from_what_is_due(
    engine: AsyncEngine,
) -> None:
    now = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=30, now=now, quota=7)
    async with engine.begin() as conn:
        await conn.execute(update(schema.plan_days).values(created_at=now - timedelta(days=1)))
    # No usage history: the 30 due consents level flat over Monday..Saturday.
    assert await _planned(engine) == 5
    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.plan_days.c.day, schema.plan_days.c.batch_quota,
                                          schema.plan_days.c.created_at))).all()
    assert sum(r.batch_quota for r in rows) == 30
    assert min(r.created_at for r in rows) >= datetime(2026, 11, 30, 0, 0, tzinfo=KST)
    assert DAY in {r.day for r in rows}


async def test_a_plan_saved_today_is_kept(engine: AsyncEngine) -> None:
    now = datetime(2026, 11, 30, 0, 30, tzinfo=KST)
    insts = make_institutions(free_ports(1), industries=("bank",))
    await populate(engine, insts, per_provider=30, now=now, quota=7)
    assert await _planned(engine) == 7
