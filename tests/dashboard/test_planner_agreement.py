"""The dashboard's flatness is the planner's: a plan saved by the planner, read back."""

from __future__ import annotations

from datetime import date, datetime, time
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.dashboard.data import load_snapshot
from batch.dashboard.figures import day_loads, flatness, summary
from batch.db import schema
from batch.planner import build_week_plan, save_plan
from batch.seed import SeedParams, load_seed, write_seed
from planning.calendar import KST
from tests.sealing import CIPHER

SUNDAY = date(2026, 11, 29)
NOW = datetime.combine(SUNDAY, time(0), tzinfo=KST)


async def test_dashboard_flatness_equals_the_saved_plans_peak_over_mean(
        engine: AsyncEngine, tmp_path: Path) -> None:
    seeded = write_seed(SeedParams(today=SUNDAY, providers=3, consents=3_000), tmp_path)
    assert seeded.last_usage_day < SUNDAY  # no actuals this week: both read the forecast
    await load_seed(engine, seeded.files, now=NOW, cipher=CIPHER)
    orgs = [p.org_code for p in seeded.providers]
    # a non-integer calls per consent, so the per-day rounding has to agree too
    async with engine.begin() as conn:
        await conn.execute(update(schema.institutions)
                           .where(schema.institutions.c.org_code == orgs[1])
                           .values(options='{"calls_per_consent": 2.5}'))
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW)
    await save_plan(engine, plan)

    snap = await load_snapshot(engine, week=SUNDAY, now=NOW)
    doc = {p["org_code"]: p for p in summary(snap)["providers"]}
    assert dict(snap.calls_per_consent)[orgs[1]] == 2.5
    for org, g in plan.days.groupby("org_code"):
        total = g.sort_values("date")["total"].to_numpy(float)
        loads = day_loads(snap, str(org))
        assert [x.total_planned_calls for x in loads] == total.astype(int).tolist()
        assert [x.batch_planned_calls for x in loads] == g.sort_values("date")[
            "batch_calls"].astype(int).tolist()
        ratio = flatness(loads).planned
        assert ratio == pytest.approx(total.max() / total.mean(), rel=1e-12)
        assert doc[str(org)]["peak_to_mean_calls"] == round(total.max() / total.mean(), 4)
