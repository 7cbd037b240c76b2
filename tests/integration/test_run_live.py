"""`run` end to end over real HTTP against the simulator, on SQLite and PostgreSQL.

Time is a ScaledClock (10x) shared by the run and the in-process simulator, so two window
minutes take 12 real seconds while every rule (windows, weeks, rates) still holds.
"""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, ScaledClock
from batch.db import schema
from batch.dispatch.runner import RunOptions, run_day
from batch.simulator import Simulator, consent_key
from planning.windows import parse_window
from tests.integration.helpers import DAY, WEEK, free_ports, make_institutions, populate
from tests.sealing import CIPHER

pytestmark = pytest.mark.integration


async def test_a_short_window_run_attempts_every_due_consent_exactly_once(
    engine: AsyncEngine,
) -> None:
    clock = ScaledClock(10, start=datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST))
    insts = make_institutions(free_ports(2), cps=50)
    tokens = await populate(engine, insts, per_provider=120, now=clock.now())
    window = parse_window("0100:0102", step=1)
    async with Simulator(insts, clock=clock, window_override=[window]) as sim:
        res = await run_day(engine, cipher=CIPHER, clock=clock, options=RunOptions(
            window_override=(window,), progress="none", page_limit=1,
            lease=timedelta(minutes=5)), stream=io.StringIO(), install_signals=False)
        stats = sim.stats(detail=True)

    summary = res.summary.to_json()
    assert res.exit_code == 0, summary
    assert summary["date"] == DAY.isoformat()
    by_org = {p["org_code"]: p for p in summary["providers"]}
    for p in insts.providers:
        s = by_org[p.org_code]
        assert (s["planned"], s["attempted"], s["succeeded"], s["deferred"]) == (
            120, 120, 120, 0), json.dumps(s)
        sp = stats["providers"][p.org_code]
        assert sp["violations"] == {"rate": 0, "window": 0, "duplicate_tran_id": 0,
                                    "concurrency": 0,
                                    "second_transfer": 0}
        assert set(sp["by_api_type"]) == {"scheduled"}
        assert set(sp["by_code"]) == {"00000"}
        assert sp["transfers"] == 120
        # page_limit=1: every item is its own page, fetched one after another
        assert sp["calls"] > 2 * 120
    for org, toks in tokens.items():
        per_consent = stats["consents"][org]
        assert sorted(per_consent) == sorted(consent_key(t) for t in toks)
        assert set(per_consent.values()) == {1}

    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.consents.c.due_week,
                                          schema.consents.c.lease_owner))).all()
    assert {r.due_week for r in rows} == {WEEK + timedelta(days=7)}
    assert {r.lease_owner for r in rows} == {None}
