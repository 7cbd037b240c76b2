"""Edge 3 over real HTTP: a plan saved before a window change makes no call outside the
provider's new windows (the simulator, given the new windows, counts every violation)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, ScaledClock
from batch.config import parse_institutions
from batch.db.loaders import load_institutions
from batch.dispatch.runner import RunOptions, run_day
from batch.planner import build_week_plan, load_day_plan, save_plan
from batch.simulator import Simulator
from tests.integration.helpers import DAY, free_ports, institutions_toml, populate
from tests.sealing import CIPHER

pytestmark = pytest.mark.integration


async def test_a_plan_saved_before_a_window_change_calls_nothing_outside_the_new_windows(
    engine: AsyncEngine,
) -> None:
    ports = free_ports(1)
    old = parse_institutions(institutions_toml(ports, industries=("bank",)).replace(
        '["0000:0600"]', '["1800:2400"]'))
    new = parse_institutions(institutions_toml(ports, industries=("bank",)))   # 0000:0600
    (org,) = [p.org_code for p in old.providers]
    saved_at = datetime(2026, 11, 30, 23, 58, 0, tzinfo=KST)
    await populate(engine, old, per_provider=120, now=saved_at - timedelta(hours=1))
    await save_plan(engine, await build_week_plan(engine, week_of=DAY, today=DAY,
                                                  now=saved_at))
    saved = (await load_day_plan(engine, day=DAY))[org]
    assert saved.batch_quota > 0 and 1439 in saved.minutes     # 23:59, inside 18:00-24:00

    await load_institutions(engine, new, now=saved_at)         # windows now 00:00-06:00
    clock = ScaledClock(10, start=saved_at + timedelta(seconds=65))   # 23:59:05
    async with Simulator(new, clock=clock) as sim:
        res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(progress="none"),
                            stream=io.StringIO(), install_signals=False)
        stats = sim.stats()

    assert stats["providers"][org]["violations"]["window"] == 0
    assert stats["total"]["calls"] == 0
    assert res.summary.replanned is not None
    assert "institutions loaded again" in res.summary.replanned
    assert res.summary.provider(org).count("planned") == 0    # nothing of 00:00-06:00 is left
