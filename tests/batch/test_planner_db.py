"""The planner against a real database (SQLite and PostgreSQL): due classes, re-planning,
saving and loading plans, and the ``plan`` command."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema
from batch.db.engine import make_engine
from batch.planner import build_week_plan, load_day_plan, save_plan
from planning.calendar import KST
from planning.minutes import minute_caps
from planning.windows import day_minutes

SUNDAY = date(2026, 11, 22)          # week 2026-11-22 .. 2026-11-28, payday Wed 25th
SATURDAY = SUNDAY + timedelta(days=6)
NOW_SUNDAY = datetime(2026, 11, 22, 0, 5, tzinfo=KST)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


async def _institution(conn: Any, org: str, *, windows: list[str], cps: float,
                       options: dict[str, Any] | None = None) -> None:
    await conn.execute(insert(schema.institutions).values(
        org_code=org, industry="bank", base_url="http://127.0.0.1:9001",
        windows=json.dumps(windows), calls_per_second=cps, max_concurrency=10,
        options=json.dumps(options or {}), updated_at=T0))


def _consents(org: str, n: int, *, due_week: date, not_before: datetime = T0,
              start: int = 0, status: str = "active") -> list[dict[str, Any]]:
    return [dict(user_id=f"u{start + i}", org_code=org, access_token="tok",
                 consented_at=T0, status=status, due_week=due_week, not_before=not_before,
                 updated_at=T0) for i in range(n)]


async def _populate(engine: AsyncEngine) -> None:
    """Two providers: A roomy, B with too little capacity for its week."""
    async with engine.begin() as conn:
        await _institution(conn, "BANKAAAAAA", windows=["0000:0600"], cps=1.0,
                           options={"calls_per_consent": 2})      # 30/min x 360 = 10,800/day
        await _institution(conn, "BANKBBBBBB", windows=["0100:0130"], cps=0.05)  # 1/min, 30/day
        rows = (_consents("BANKAAAAAA", 300, due_week=SUNDAY)
                + _consents("BANKAAAAAA", 40, due_week=SUNDAY - timedelta(7), start=300)
                # released Thursday 09:00 KST: may not go before Thursday
                + _consents("BANKAAAAAA", 70, due_week=SUNDAY, start=400,
                            not_before=datetime(2026, 11, 26, 9, 0, tzinfo=KST))
                + _consents("BANKAAAAAA", 5, due_week=SUNDAY + timedelta(7), start=500)
                + _consents("BANKAAAAAA", 5, due_week=SUNDAY, status="dead", start=600)
                + _consents("BANKBBBBBB", 250, due_week=SUNDAY))
        await conn.execute(insert(schema.consents), rows)
        usage = []
        for i in range(1, 60):
            d = SUNDAY - timedelta(days=i)
            usage.append(dict(org_code="BANKAAAAAA", day=d,
                              user_calls=400 if d.weekday() < 5 else 100))
        await conn.execute(insert(schema.usage_daily), usage)


async def test_week_plan_places_every_due_consent_inside_its_release_and_deadline(
        engine: AsyncEngine) -> None:
    await _populate(engine)
    plan = await build_week_plan(engine, week_of=SUNDAY + timedelta(3), today=SUNDAY,
                                 now=NOW_SUNDAY)
    a = plan.days[plan.days["org_code"] == "BANKAAAAAA"].set_index("date")
    assert list(a.index) == [SUNDAY + timedelta(i) for i in range(7)]
    assert int(a["batch_quota"].sum()) == 300 + 40 + 70          # not next week's, not dead
    # backlog is levelled with the rest, counted as overdue, first in each day's quota
    assert int(a["overdue"].sum()) == 40
    assert int(a.loc[SUNDAY, "overdue"]) == min(40, int(a.loc[SUNDAY, "batch_quota"]))
    assert int(a["unplaceable"].sum()) == 0
    # Thursday's 70 cannot move earlier: Thu..Sat carry at least 70
    assert int(a.loc[SUNDAY + timedelta(4):, "batch_quota"].sum()) >= 70
    # 00:05..05:59 left at 00:05:00: 355 minutes of 30, the last one (its start margin) 25
    assert int(a.loc[SUNDAY, "capacity"]) == 354 * 30 + 25
    assert (a["total"] == a["forecast_user_calls"] + a["batch_calls"]).all()
    assert (a["batch_calls"] == 2 * a["batch_quota"]).all()
    # weekend user load is low: the batch leans on the weekend days
    assert int(a.loc[SATURDAY, "batch_quota"]) > int(a.loc[SUNDAY + timedelta(1),
                                                            "batch_quota"])


async def test_capacity_shortfall_is_reported_per_provider_not_dropped(
        engine: AsyncEngine) -> None:
    await _populate(engine)
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    b = plan.days[plan.days["org_code"] == "BANKBBBBBB"]
    assert list(b["capacity"]) == [30] * 7
    assert list(b["batch_quota"]) == [30] * 7
    assert plan.unplaceable() == {"BANKBBBBBB": 250 - 210}
    assert int(b.loc[b["date"] == SATURDAY, "unplaceable"].iloc[0]) == 40


async def test_minute_plans_sum_to_each_days_quota_within_the_window(
        engine: AsyncEngine) -> None:
    await _populate(engine)
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    for day in plan.week:
        plans = plan.day_plans(day)
        for org, dp in plans.items():
            assert sum(dp.minutes.values()) == dp.batch_quota, (org, day)
            lim = plan.limits[org]
            mins = day_minutes(lim.windows)
            cap = dict(zip(mins, minute_caps(mins, lim.per_minute_cap), strict=True))
            assert all(0 < t <= cap[m] for m, t in dp.minutes.items())
    b = plan.day_plans(SUNDAY)["BANKBBBBBB"]
    assert set(b.minutes) == set(range(60, 90))


async def test_replanning_keeps_past_days_and_relevels_the_rest(engine: AsyncEngine) -> None:
    await _populate(engine)
    wed = SUNDAY + timedelta(3)
    async with engine.begin() as conn:
        # Sunday and Monday ran 120 consents of A: they left the due set, one failed twice.
        ids = (await conn.execute(select(schema.consents.c.id)
                                  .where(schema.consents.c.org_code == "BANKAAAAAA",
                                         schema.consents.c.due_week == SUNDAY)
                                  .order_by(schema.consents.c.id).limit(120))).scalars().all()
        await conn.execute(schema.consents.update()
                           .where(schema.consents.c.id.in_(ids[:119]))
                           .values(due_week=SUNDAY + timedelta(7)))
        outcomes = [dict(run_id="r1", consent_id=i, org_code="BANKAAAAAA",
                         day=SUNDAY if k < 60 else SUNDAY + timedelta(1),
                         kind="success", action="done", calls=2, at=T0)
                    for k, i in enumerate(ids)]
        outcomes.append(dict(run_id="r1", consent_id=ids[119], org_code="BANKAAAAAA",
                             day=SUNDAY + timedelta(1), kind="fault", action="retry_later",
                             calls=2, at=T0))
        await conn.execute(insert(schema.call_outcomes), outcomes)
        await conn.execute(insert(schema.usage_daily).values(
            org_code="BANKAAAAAA", day=SUNDAY, user_calls=123))
    now = datetime.combine(wed, datetime.min.time(), tzinfo=KST)
    plan = await build_week_plan(engine, week_of=wed, today=wed, now=now)
    a = plan.days[plan.days["org_code"] == "BANKAAAAAA"].set_index("date")
    assert int(a.loc[SUNDAY, "batch_quota"]) == 60
    assert int(a.loc[SUNDAY + timedelta(1), "batch_quota"]) == 60
    assert int(a.loc[SUNDAY + timedelta(2), "batch_quota"]) == 0
    assert not a.loc[:SUNDAY + timedelta(2), "planned"].any()
    assert a.loc[wed:, "planned"].all()
    # still due: 300 - 119 this week + 40 backlog (levelled, overdue) + 70 from Thursday
    assert int(a.loc[wed:, "batch_quota"].sum()) == 300 - 119 + 40 + 70
    assert int(a.loc[wed:, "overdue"].sum()) == 40
    assert int(a.loc[SUNDAY, "forecast_user_calls"]) == 123        # actual usage, Sunday
    assert int(a.loc[SUNDAY + timedelta(1), "forecast_user_calls"]) == 400  # forecast, Monday


async def test_save_replaces_only_planned_days_and_load_reads_it_back(
        engine: AsyncEngine) -> None:
    await _populate(engine)
    assert await load_day_plan(engine, day=SUNDAY) == {}
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    await save_plan(engine, plan)
    await save_plan(engine, plan)                                   # replaces, no duplicates
    loaded = await load_day_plan(engine, day=SUNDAY + timedelta(2))
    expected = plan.day_plans(SUNDAY + timedelta(2))
    assert loaded == expected
    async with engine.connect() as conn:
        n_days = (await conn.execute(select(func.count()).select_from(schema.plan_days))
                  ).scalar_one()
    assert n_days == 2 * 7

    wed = SUNDAY + timedelta(3)
    replan = await build_week_plan(engine, week_of=wed, today=wed,
                                   now=datetime.combine(wed, datetime.min.time(), tzinfo=KST))
    await save_plan(engine, replan)
    assert await load_day_plan(engine, day=SUNDAY) == plan.day_plans(SUNDAY)   # kept
    assert await load_day_plan(engine, day=wed) == replan.day_plans(wed)


async def test_today_outside_the_week_is_refused(engine: AsyncEngine) -> None:
    from batch.errors import InputError

    with pytest.raises(InputError, match="not in the week"):
        await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY + timedelta(7),
                              now=NOW_SUNDAY)


# --- the CLI -----------------------------------------------------------------------------

def _cli(db_url: str, *args: str) -> Any:
    from batch.cli import main

    return CliRunner().invoke(main, ["--db", db_url, "plan", *args], catch_exceptions=False)


def _count_plan_rows(db_url: str) -> int:
    async def count() -> int:
        eng = make_engine(db_url)
        try:
            async with eng.connect() as conn:
                return int((await conn.execute(
                    select(func.count()).select_from(schema.plan_days))).scalar_one())
        finally:
            await eng.dispose()

    return asyncio.run(count())


@pytest.fixture
async def populated(engine: AsyncEngine, db_url: str) -> str:
    await _populate(engine)
    return db_url


def test_plan_json_lists_every_provider_and_day(populated: str) -> None:
    res = _cli(populated, "--week", "2026-11-25", "--today", "2026-11-22", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 14
    assert {"org_code", "date", "forecast_user_calls", "batch_quota", "total"} <= set(rows[0])
    a = [r for r in rows if r["org_code"] == "BANKAAAAAA"]
    assert [r["date"] for r in a] == [(SUNDAY + timedelta(i)).isoformat() for i in range(7)]
    assert sum(r["batch_quota"] for r in a) == 410


def test_plan_csv_has_a_header_and_one_row_per_provider_day(populated: str) -> None:
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-11-22", "--format", "csv")
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].split(",")[:5] == ["org_code", "date", "forecast_user_calls",
                                       "batch_quota", "batch_calls"]
    assert len(lines) == 1 + 14


def test_plan_dry_run_writes_nothing_and_save_writes(populated: str) -> None:
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-11-22")
    assert res.exit_code == 0, res.output
    assert "dry run" in res.stdout
    assert _count_plan_rows(populated) == 0
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-11-22", "--dry-run")
    assert _count_plan_rows(populated) == 0
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-11-22", "--save")
    assert res.exit_code == 0, res.output
    assert _count_plan_rows(populated) == 14


def test_plan_table_is_aligned_and_shouts_about_unplaceable(populated: str) -> None:
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-11-22")
    out = res.stdout
    assert "40 CONSENTS CANNOT BE PLACED" in out
    assert "BANKBBBBBB 40" in out
    assert "ours/uniform" in out and "an even split would peak at 517" in out
    assert "Totals: 2 providers" in out
    block = out.split("BANKAAAAAA  windows", 1)[1].splitlines()[1:10]   # header, 7 days, week
    assert block[0].split()[:3] == ["date", "day", "user"]
    assert block[8].split()[0] == "week"
    assert len({len(line) for line in block}) == 1                       # right-aligned
    assert "warning: 40 consents" in res.stderr


def test_plan_refuses_a_today_outside_the_week(populated: str) -> None:
    res = _cli(populated, "--week", "2026-11-22", "--today", "2026-12-01")
    assert res.exit_code == 2
    assert "not in the week" in res.stderr


async def test_an_empty_database_plans_nothing_and_saves_nothing(engine: AsyncEngine) -> None:
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    assert plan.days.empty and plan.minutes.empty
    assert plan.unplaceable() == {}
    await save_plan(engine, plan)
    assert await load_day_plan(engine, day=SUNDAY) == {}


async def test_a_provider_with_nothing_due_gets_zero_quotas_and_no_minutes(
        engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await _institution(conn, "CARDCCCCCC", windows=["2300:0500"], cps=10.0)
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    assert plan.days["batch_quota"].tolist() == [0] * 7
    # 23:00..04:59 at 200 a minute, the last minute of each segment (04:59, and 23:59 where
    # the day's run ends) 166: no start in its last 10 s
    assert plan.days["capacity"].tolist()[1:] == [358 * 200 + 2 * 166] * 6
    assert plan.minutes.empty


async def test_a_failed_save_leaves_the_previous_plan_in_place(engine: AsyncEngine) -> None:
    import dataclasses

    import pandas as pd

    await _populate(engine)
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=NOW_SUNDAY)
    await save_plan(engine, plan)
    stray = pd.DataFrame({"org_code": ["NOSUCHORG1"], "date": [SUNDAY], "minute": [5],
                          "target": [1]})
    bad = dataclasses.replace(plan, minutes=pd.concat([plan.minutes, stray]),
                              days=plan.days.assign(batch_quota=plan.days["batch_quota"] + 1))
    with pytest.raises(Exception, match=r"(?i)foreign key"):
        await save_plan(engine, bad)
    assert await load_day_plan(engine, day=SUNDAY) == plan.day_plans(SUNDAY)


async def test_nothing_goes_on_today_when_its_window_is_already_over(
        engine: AsyncEngine) -> None:
    await _populate(engine)
    noon = datetime(2026, 11, 22, 12, 0, tzinfo=KST)         # A's window 00:00-06:00 is over
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=noon)
    a = plan.days[plan.days["org_code"] == "BANKAAAAAA"].set_index("date")
    assert int(a.loc[SUNDAY, "capacity"]) == 0
    assert int(a.loc[SUNDAY, "batch_quota"]) == 0
    assert int(a.loc[SUNDAY + timedelta(1):, "overdue"].sum()) == 40
    assert "BANKAAAAAA" not in plan.unplaceable()
