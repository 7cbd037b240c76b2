"""A worker of ``run --processes`` that printed no summary: its work read back from the
database (batch/cluster/readback.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cluster.processes import child_argv, merge_summaries
from batch.cluster.readback import read_back
from batch.db import schema, work
from batch.dispatch.summary import RunSummary
from batch.lifecycle import Done, NotAttempted, Refreshed, RetryLater, Transition, WeekResult

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
DAY = date(2026, 11, 30)
WEEK = date(2026, 11, 29)
ORG = "BANK000001"


async def _seed(engine: AsyncEngine, *, consents: int, quota: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code=ORG, industry="bank", base_url="http://127.0.0.1:1",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=5, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"user_id": f"u{i}", "org_code": ORG, "access_token": f"tok-{i}",
             "consented_at": NOW - timedelta(days=30), "due_week": WEEK,
             "not_before": NOW - timedelta(days=30), "updated_at": NOW}
            for i in range(consents)])
        await conn.execute(insert(schema.plan_days).values(
            org_code=ORG, day=DAY, week_start=WEEK, forecast_user_calls=100,
            batch_quota=quota, capacity=10**6, unplaceable=0, created_at=NOW))


async def _open(engine: AsyncEngine, run_id: str, worker: str, summary: str | None = None
                ) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.runs).values(
            run_id=run_id, day=DAY, worker_id=worker, started_at=NOW, summary=summary))


def _log(cid: int, kind: str, code: str, calls: int) -> Refreshed:
    return Refreshed(cid, ORG, NOW, kind, code, "T" * 25, calls, 5)


async def test_a_dead_workers_run_is_counted_again_from_its_outcomes(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, consents=6, quota=10)
    await _open(engine, "dead-run", "box-p1")
    got = await work.claim(engine, ORG, worker="box-p1", week=WEEK, now=NOW, limit=5)
    done, retry, skipped = got[:2], got[2], got[3]
    changes: list[Transition] = [
        *(Done(_log(c.id, "success", "00000", 2), next_week=WEEK + timedelta(days=7))
          for c in done),
        RetryLater(_log(retry.id, "fault", "50001", 3), week=WEEK, attempts=1,
                   unknown_attempts=0, not_before=NOW + timedelta(minutes=10),
                   week_result=WeekResult.RETRYING, error="fault"),
        NotAttempted(Refreshed(skipped.id, ORG, NOW, "rejected")),
    ]
    await work.apply(engine, changes, run_id="dead-run", worker="box-p1", day=DAY)
    # another run's outcomes of the same day are not this one's
    await _open(engine, "other-run", "box-p0")
    await work.apply(engine, [Done(_log(got[4].id, "success", "00000", 2),
                                   next_week=WEEK + timedelta(days=7))],
                     run_id="other-run", worker="box-p1", day=DAY)

    back = await read_back(engine, "dead-run", worker="box-p1", ended="was killed by SIGKILL")
    assert back is not None
    assert (back.run_id, back.worker_id, back.date, back.week_start) == (
        "dead-run", "box-p1", "2026-11-30", "2026-11-29")
    assert (back.status, back.exit_code, back.outcomes_persisted) == ("incomplete", 1, False)
    assert back.error and "box-p1 was killed by SIGKILL" in back.error
    (p,) = back.providers
    c = p.counters
    assert (c["planned"], c["attempted"], c["succeeded"], c["failed"], c["not_attempted"],
            c["deferred"], c["calls"]) == (10, 3, 2, 1, 1, 7, 7)
    assert p.by_code == {"00000": 2, "50001": 1}
    assert p.by_action == {"done": 2, "retry_later": 1, "not_attempted": 1}
    assert p.extra["cluster"] == {"worker": "box-p1", "ended": "was killed by SIGKILL",
                                  "read_back": True}

    # merged with a survivor: the plan once, the work summed, the survivor's deferred and
    # breaker; the dead one listed among the workers
    alive = RunSummary.from_json({
        "run_id": "live-run", "date": "2026-11-30", "worker_id": "box-p0", "status": "done",
        "providers": [{"org_code": ORG, "planned": 10, "attempted": 5, "succeeded": 5,
                       "failed": 0, "deferred": 0, "dead_lettered": 0, "calls": 10,
                       "breaker": "cluster_closed", "cluster": {"node_id": 1}}]})
    m = merge_summaries([alive, back], worker_id="box", codes=[0, -9])
    p = m.provider(ORG)
    assert (p.counters["planned"], p.counters["attempted"], p.counters["deferred"],
            p.counters["calls"]) == (10, 8, 0, 17)
    assert p.breaker == "cluster_closed" and len(p.extra["workers"]) == 2
    assert (m.status, m.exit_code, m.run_id) == ("incomplete", 1, "live-run+dead-run")
    from batch.dispatch.summary import format_summary
    assert "\nattention: worker process box-p1 was killed by SIGKILL: its work read back" \
        in format_summary(m)


async def test_a_stored_summary_is_read_back_whole_and_a_run_never_opened_is_none(
    engine: AsyncEngine,
) -> None:
    stored = RunSummary.from_json({
        "run_id": "late-death", "date": "2026-11-30", "worker_id": "box-p2",
        "status": "done", "providers": [{"org_code": ORG, "planned": 4, "attempted": 4,
                                         "succeeded": 4, "failed": 0, "deferred": 0,
                                         "dead_lettered": 0}]})
    await _open(engine, "late-death", "box-p2", summary=stored.dumps())
    assert await read_back(engine, "late-death", worker="box-p2", ended="exited 1") == stored
    assert await read_back(engine, "never", worker="box-p3", ended="exited 2") is None


def test_each_child_is_given_its_run_id() -> None:
    assert child_argv(["run"], 0, "h", "abc")[-2:] == ["--run-id", "abc"]
    assert "--run-id" not in child_argv(["run"], 0, "h")


async def test_children_that_die_before_any_run_are_said_to_have_done_nothing(
    engine: AsyncEngine, db_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    from batch.cluster.processes import _read_back

    caplog.set_level(logging.ERROR, logger="mydata.cluster")
    await _seed(engine, consents=1, quota=1)
    await _open(engine, "dead-run", "box-p1")
    parts = await _in_thread(_read_back, db_url, [("box-p0", "never-opened", 2, 0),
                                                  ("box-p1", "dead-run", -9, 1)])
    assert [p.run_id for p in parts] == ["dead-run"]
    lines = sorted(r.getMessage() for r in caplog.records)
    assert lines[0].startswith("worker process box-p0 exited 2 and printed no summary: no "
                               "run never-opened in the database: it did no work")
    assert lines[1].startswith("worker process box-p1 was killed by SIGKILL and printed no "
                               "summary: its work (0 attempted) read back from the database")


async def _in_thread(fn: object, *args: object) -> list[RunSummary]:
    import asyncio

    return await asyncio.to_thread(fn, *args)  # type: ignore[arg-type]
