"""The week boundary on the fake clock: a consent that failed last week is levelled into this
week by the planner (counted overdue, not crammed onto one day), then claimed first on
Sunday with fresh counters and no stale resume point, and refreshed exactly once.

The plan is made on the real database (both backends); the day is dispatched against the
in-memory store (the store contract, tests/db/test_lifecycle_contract.py, holds it to the
same rows as SQLite and PostgreSQL), seeded with the same consents, on a FakeClock."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.client import Progress, RefreshResult
from batch.clock import KST, FakeClock
from batch.db import schema
from batch.db.memory import MemoryWorkStore
from batch.db.work import Claim
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.provider import DispatchSettings, ProviderDispatcher
from batch.dispatch.writer import OutcomeWriter
from batch.planner import build_week_plan
from batch.resilience.outcomes import Kind, Outcome
from tests.batch.test_plan_edges import ORG, SUNDAY, T0, _consents, _provider

LAST_WEEK = SUNDAY - timedelta(days=7)
NEXT_WEEK = SUNDAY + timedelta(days=7)
START = datetime(2026, 11, 29, 0, 5, tzinfo=KST)     # Sunday 00:05 KST, a new week
BACKLOG = 15                                          # ids 1..15: due last week, not done
THIS_WEEK = 6
LEFT_OVER = Progress(("A0",), "1").to_json()          # last week's transfer, stopped part way


async def test_a_consent_failed_last_week_is_levelled_in_with_fresh_counters_and_refreshed_once(
    engine: AsyncEngine,
) -> None:
    # -- the plan: 15 backlog consents (id 1 the one that failed) + 6 of this week
    await _provider(engine)
    await _consents(engine, BACKLOG, due_week=LAST_WEEK, start=0)
    await _consents(engine, THIS_WEEK, due_week=SUNDAY, start=100)
    async with engine.begin() as conn:  # last week it failed four times, part way
        await conn.execute(update(schema.consents).where(schema.consents.c.id == 1).values(
            attempts=4, unknown_attempts=1, counters_week=LAST_WEEK, pending_items=LEFT_OVER,
            week_result="retrying"))
    plan = await build_week_plan(engine, week_of=SUNDAY, today=SUNDAY, now=START)
    quotas = [int(q) for q in plan.days.set_index("date")["batch_quota"]]
    assert quotas == [3] * 7                           # levelled, not 15 crammed on Sunday
    today = plan.day_plans(SUNDAY)[ORG]
    assert plan.overdue() == {ORG: BACKLOG} and today.overdue == 3     # Sunday's 3: backlog
    assert today.batch_quota == 3 and sum(today.minutes.values()) == 3

    # -- Sunday's run on the fake clock, the same consents in the store
    clock = FakeClock(START)
    store = MemoryWorkStore()
    store.add(ORG, BACKLOG, week=LAST_WEEK, not_before=T0, first_id=1)
    store.add(ORG, THIS_WEEK, week=SUNDAY, not_before=T0, first_id=BACKLOG + 1)
    old = store.consents[1]
    old.attempts, old.unknown_attempts, old.counters_week = 4, 1, LAST_WEEK
    old.pending_items, old.week_result = LEFT_OVER, "retrying"
    seen: list[tuple[int, int, int, Progress | None]] = []

    async def refresh(claim: Claim, not_after: float | None) -> RefreshResult:
        seen.append((claim.id, claim.attempts, claim.unknown_attempts, claim.progress))
        return RefreshResult(Outcome(Kind.SUCCESS, "00000", 200), calls=2)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=SUNDAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=refresh, writer=writer, clock=clock,
        settings=DispatchSettings(worker_id="w1"), policy=RetryPolicy(max_attempts=5),
        day=SUNDAY, week=SUNDAY, quota=today.batch_quota, minutes=today.minutes,
        per_minute_cap=6000)
    stop = asyncio.Event()
    wt = writer.start()
    task = asyncio.create_task(d.run(stop))
    await clock.run_for((max(today.minutes) + 2) * 60 - 5 * 60)
    stop.set()
    await clock.run_for(5)
    await task
    assert await writer.close()
    await wt

    assert seen[0] == (1, 0, 0, None)                  # first, counters and resume fresh
    assert [s[0] for s in seen] == [1, 2, 3]           # the day's 3, backlog, oldest first
    assert (old.due_week, old.week_result, old.attempts, old.unknown_attempts) == (
        NEXT_WEEK, "done", 0, 0)
    assert store.dead_letters == []
    # done for the week: nothing of it is due again before next Sunday
    later = START + timedelta(days=3)
    again = await store.claim(ORG, worker="w2", week=SUNDAY, now=later, limit=100)
    assert 1 not in {c.id for c in again}
