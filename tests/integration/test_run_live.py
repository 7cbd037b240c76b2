"""`run` end to end over real HTTP against the simulator, on SQLite and PostgreSQL.

Time is a ScaledClock (10x) shared by the run and the in-process simulator, so two window
minutes take 12 real seconds while every rule (windows, weeks, rates) still holds.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST, ScaledClock
from batch.config import Institutions
from batch.db import schema
from batch.dispatch.runner import RunOptions, RunResult, run_day
from batch.simulator import Simulator, consent_key
from planning.windows import parse_window
from tests.integration.helpers import (
    DAY,
    WEEK,
    free_ports,
    kill_backends,
    make_institutions,
    populate,
)
from tests.sealing import CIPHER

pytestmark = pytest.mark.integration


def _each_consent_fetched_once(res: RunResult, insts: Institutions, stats: dict[str, Any],
                               tokens: dict[str, list[str]], *, per_provider: int) -> None:
    """The run ended well and the simulator saw each consent transferred once: every
    provider's ``per_provider`` consents planned, attempted and succeeded, no rule broken."""
    summary = res.summary.to_json()
    assert res.exit_code == 0, summary
    by_org = {p["org_code"]: p for p in summary["providers"]}
    n = per_provider
    for p in insts.providers:
        s = by_org[p.org_code]
        assert (s["planned"], s["attempted"], s["succeeded"], s["deferred"]) == (
            n, n, n, 0), json.dumps(s)
        sp = stats["providers"][p.org_code]
        assert sp["violations"] == {"rate": 0, "window": 0, "duplicate_tran_id": 0,
                                    "concurrency": 0,
                                    "second_transfer": 0}
        assert sp["transfers"] == n
    for org, toks in tokens.items():
        per_consent = stats["consents"][org]
        assert sorted(per_consent) == sorted(consent_key(t) for t in toks)
        assert set(per_consent.values()) == {1}


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

    _each_consent_fetched_once(res, insts, stats, tokens, per_provider=120)
    assert res.summary.to_json()["date"] == DAY.isoformat()
    for p in insts.providers:
        sp = stats["providers"][p.org_code]
        assert set(sp["by_api_type"]) == {"scheduled"}
        assert set(sp["by_code"]) == {"00000"}
        # page_limit=1: every item is its own page, fetched one after another
        assert sp["calls"] > 2 * 120

    async with engine.connect() as conn:
        rows = (await conn.execute(select(schema.consents.c.due_week,
                                          schema.consents.c.lease_owner))).all()
    assert {r.due_week for r in rows} == {WEEK + timedelta(days=7)}
    assert {r.lease_owner for r in rows} == {None}


async def test_a_run_whose_database_connections_are_killed_twice_loses_nothing(
    pg: AsyncEngine, pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The server ends every connection of the run twice (as a restart would), once in each
    window minute: claims, start marks, lease renewals and outcome writes fail for a moment
    and are made again on new connections; every consent is still fetched exactly once and
    its outcome written, and no lease is left behind."""
    clock = ScaledClock(10, start=datetime(2026, 11, 30, 0, 59, 57, tzinfo=KST))
    insts = make_institutions(free_ports(2), cps=50)
    tokens = await populate(pg, insts, per_provider=120, now=clock.now())
    window = parse_window("0100:0102", step=1)
    killed: list[int] = []

    async def kill_twice() -> None:
        for at in (33.0, 95.0):  # 01:00:30 and 01:01:32, in the clock's seconds
            await clock.sleep_until(clock_start + at)
            killed.append(await kill_backends(pg_url))

    clock_start = clock.monotonic()
    async with Simulator(insts, clock=clock, window_override=[window]) as sim:
        killer = asyncio.create_task(kill_twice())
        res = await run_day(pg, cipher=CIPHER, clock=clock, options=RunOptions(
            window_override=(window,), progress="none", page_limit=1,
            lease=timedelta(minutes=5)), stream=io.StringIO(), install_signals=False)
        await killer
        stats = sim.stats(detail=True)

    # the killed connections were in steady use: not pinged, each failed one operation
    failed = {getattr(r, "action", None) for r in caplog.records if r.levelno >= logging.WARNING}
    assert failed & {"claim_failed", "write_failed", "mark_failed", "renew_failed"}, failed
    assert len(killed) == 2 and all(n >= 1 for n in killed), killed
    _each_consent_fetched_once(res, insts, stats, tokens, per_provider=120)
    async with pg.connect() as conn:
        rows = (await conn.execute(select(
            schema.consents.c.due_week, schema.consents.c.lease_owner,
            schema.consents.c.started_at, schema.consents.c.week_result))).all()
        logged = (await conn.execute(select(schema.call_outcomes.c.consent_id))).all()
    assert len(rows) == 240
    assert {(r.due_week, r.lease_owner, r.started_at, r.week_result) for r in rows} == {
        (WEEK + timedelta(days=7), None, None, "done")}
    assert len(logged) == len({r.consent_id for r in logged}) == 240
