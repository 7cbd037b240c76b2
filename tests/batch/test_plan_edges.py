"""The planner's edges against a real database: backlog is levelled over the week (not
crammed onto one day) and counted as overdue; consents are released by window time, and
what no window minute of the week can take is unplaceable."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema, work
from batch.planner import build_week_plan
from planning.calendar import KST

SUNDAY = date(2026, 11, 29)
MONDAY = SUNDAY + timedelta(1)
SATURDAY = SUNDAY + timedelta(6)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ORG = "BANK000001"


async def _provider(engine: AsyncEngine, *, cps: float = 100.0) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code=ORG, industry="bank", base_url="http://127.0.0.1:9", windows=json.dumps(
                ["0000:0600"]), calls_per_second=cps, max_concurrency=10, options="{}",
            updated_at=T0))


async def _consents(engine: AsyncEngine, n: int, *, due_week: date, not_before: datetime = T0,
                    start: int = 0) -> None:
    rows: list[dict[str, Any]] = [
        dict(user_id=f"u{start + i}", org_code=ORG, access_token="tok", consented_at=T0,
             due_week=due_week, not_before=not_before, updated_at=T0) for i in range(n)]
    async with engine.begin() as conn:
        await conn.execute(insert(schema.consents), rows)


async def _plan(engine: AsyncEngine, now: datetime) -> Any:
    plan = await build_week_plan(engine, week_of=now.date(), today=now.date(), now=now)
    return plan, plan.days.set_index("date")


# --- edge 5: backlog is due this week, levelled, claimed first -------------------------------

async def test_backlog_is_levelled_over_the_week_not_crammed_onto_the_first_day(
        engine: AsyncEngine) -> None:
    await _provider(engine)                                    # 2,000 consents a minute
    await _consents(engine, 700, due_week=SUNDAY)
    await _consents(engine, 600, due_week=SUNDAY - timedelta(7), start=1000)   # last week
    # never fetched, imported long after its consent date: due in its consent's week
    await _consents(engine, 100, due_week=date(2026, 3, 1), start=2000)
    plan, days = await _plan(engine, datetime(2026, 11, 29, 0, 5, tzinfo=KST))
    quotas = [int(q) for q in days["batch_quota"]]
    assert sum(quotas) == 1400
    assert max(quotas) - min(quotas) <= 1                     # flat: 200 a day
    assert int(days["overdue"].sum()) == 700
    assert plan.overdue() == {ORG: 700}
    # claimed first each day: the first days' quotas are all backlog
    assert int(days.loc[SUNDAY, "overdue"]) == int(days.loc[SUNDAY, "batch_quota"])
    assert int(days.loc[SATURDAY, "overdue"]) == 0


async def test_backlog_is_claimed_first_oldest_week_first(engine: AsyncEngine) -> None:
    await _provider(engine)
    await _consents(engine, 3, due_week=SUNDAY)                               # ids 1..3
    await _consents(engine, 2, due_week=SUNDAY - timedelta(7), start=10)      # ids 4..5
    await _consents(engine, 1, due_week=date(2026, 3, 1), start=20)           # id 6
    got = await work.claim(engine, ORG, worker="w", week=SUNDAY,
                           now=datetime(2026, 11, 29, 1, 0, tzinfo=KST), limit=3)
    assert [c.due_week for c in got] == [date(2026, 3, 1), SUNDAY - timedelta(7),
                                         SUNDAY - timedelta(7)]


# --- edge 6: release by window time ---------------------------------------------------------

async def test_a_consent_due_after_todays_window_closed_is_planned_from_tomorrow(
        engine: AsyncEngine) -> None:
    await _provider(engine)
    # due again Monday 10:00; Monday's window is 00:00-06:00
    await _consents(engine, 50, due_week=SUNDAY,
                    not_before=datetime(2026, 11, 30, 10, 0, tzinfo=KST))
    plan, days = await _plan(engine, datetime(2026, 11, 30, 0, 5, tzinfo=KST))
    assert int(days.loc[MONDAY, "batch_quota"]) == 0
    assert int(days.loc[MONDAY + timedelta(1):, "batch_quota"].sum()) == 50
    assert plan.unplaceable() == {}


async def test_a_consent_due_after_saturdays_window_is_unplaceable_not_silently_lost(
        engine: AsyncEngine) -> None:
    await _provider(engine)
    await _consents(engine, 5, due_week=SUNDAY,
                    not_before=datetime(2026, 12, 5, 10, 0, tzinfo=KST))
    await _consents(engine, 7, due_week=SUNDAY, start=100)
    plan, days = await _plan(engine, datetime(2026, 11, 30, 0, 5, tzinfo=KST))
    assert int(days["batch_quota"].sum()) == 7
    assert plan.unplaceable() == {ORG: 5}
    assert int(days.loc[SATURDAY, "unplaceable"]) == 5


# --- the plan command: overdue per provider, a stale saved plan said ----------------------

def _plan_cli(db_url: str, *args: str) -> Any:
    from click.testing import CliRunner

    from batch.cli import main

    return CliRunner().invoke(main, ["--db", db_url, "plan", "--today", "2026-11-29", *args],
                              catch_exceptions=False)


@pytest.fixture
async def due(engine: AsyncEngine, db_url: str) -> str:
    """70 consents due this week and 14 of last week, at one provider."""
    await _provider(engine)
    await _consents(engine, 70, due_week=SUNDAY)
    await _consents(engine, 14, due_week=SUNDAY - timedelta(7), start=1000)
    return db_url


def test_plan_json_and_table_count_overdue_per_provider(due: str) -> None:
    rows = json.loads(_plan_cli(due, "--format", "json").stdout)
    assert sum(r["overdue"] for r in rows) == 14
    table = _plan_cli(due).stdout
    assert "overdue" in table.splitlines()[3]
    assert "14 consents overdue" in table


def _mark_consents_loaded(db_url: str) -> None:
    from batch.db.engine import make_engine
    from batch.db.marks import mark_loaded

    async def go() -> None:
        eng = make_engine(db_url)
        try:
            async with eng.begin() as conn:
                await mark_loaded(conn, "consents", T0)
        finally:
            await eng.dispose()

    asyncio.run(go())


def test_plan_says_the_saved_plan_is_stale_after_consents_are_loaded_again(due: str) -> None:
    saved = _plan_cli(due, "--save")
    assert saved.exit_code == 0 and "stale" not in saved.stderr
    assert "stale" not in _plan_cli(due).stderr
    _mark_consents_loaded(due)
    res = _plan_cli(due)
    assert res.exit_code == 0
    (line,) = [ln for ln in res.stderr.splitlines() if "stale" in ln]
    assert line == ("mydata-batch: the saved plan for 2026-11-29 is stale (consents loaded "
                    "again since the plan was made): `run` re-makes it (or `plan --save`)")
    assert "replaced by this one" in _plan_cli(due, "--save").stderr
    assert "stale" not in _plan_cli(due).stderr
