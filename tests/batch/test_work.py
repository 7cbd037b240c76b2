from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema, work
from batch.lifecycle import DeadAsset, Done, Refreshed, RetryLater, Transition, WeekResult

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
WEEK = date(2026, 11, 29)


async def _seed(engine: AsyncEngine, n: int, *, due_week: date = WEEK) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code="BANK000001", industry="bank", base_url="http://127.0.0.1:1",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=5, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"user_id": f"u{i}", "org_code": "BANK000001", "access_token": f"tok-{i}",
             "consented_at": NOW - timedelta(days=30), "due_week": due_week,
             "not_before": NOW - timedelta(days=30), "updated_at": NOW}
            for i in range(n)
        ])


async def test_claims_follow_the_keyset_and_never_hand_out_a_leased_consent(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, 10)
    first = await work.claim(engine, "BANK000001", worker="w1", week=WEEK, now=NOW, limit=4)
    assert [c.user_id for c in first] == ["u0", "u1", "u2", "u3"]
    second = await work.claim(engine, "BANK000001", worker="w1", week=WEEK, now=NOW, limit=4,
                              after=first[-1].cursor)
    assert [c.user_id for c in second] == ["u4", "u5", "u6", "u7"]
    # Another worker scanning from the start skips everything leased.
    other = await work.claim(engine, "BANK000001", worker="w2", week=WEEK, now=NOW, limit=10)
    assert [c.user_id for c in other] == ["u8", "u9"]
    assert not any(c.stale for c in first + second + other)


async def test_expired_lease_of_a_started_claim_comes_back_marked_stale(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, 2)
    got = await work.claim(engine, "BANK000001", worker="dead", week=WEEK, now=NOW, limit=2,
                           lease=timedelta(seconds=30))
    await work.mark_started(engine, [c.id for c in got], worker="dead", at=NOW)
    none_yet = await work.claim(engine, "BANK000001", worker="w2", week=WEEK,
                                now=NOW + timedelta(seconds=10), limit=2)
    assert none_yet == []
    back = await work.claim(engine, "BANK000001", worker="w2", week=WEEK,
                            now=NOW + timedelta(seconds=31), limit=2)
    assert [c.stale for c in back] == [True, True]
    assert [c.unknown_attempts for c in back] == [1, 1]


async def test_release_returns_claims_without_marking_them(engine: AsyncEngine) -> None:
    await _seed(engine, 3)
    got = await work.claim(engine, "BANK000001", worker="w1", week=WEEK, now=NOW, limit=3)
    assert await work.release(engine, [c.id for c in got], worker="w1") == 3
    again = await work.claim(engine, "BANK000001", worker="w2", week=WEEK, now=NOW, limit=3)
    assert len(again) == 3 and not any(c.stale for c in again)


async def test_applied_transitions_move_the_consent_and_log_each_refresh(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, 3)
    c = await work.claim(engine, "BANK000001", worker="w1", week=WEEK, now=NOW, limit=3)
    at = NOW + timedelta(seconds=1)
    nxt = WEEK + timedelta(days=7)
    await work.apply(engine, [
        Done(_log(c[0].id, at, "success", "00000"), next_week=nxt),
        RetryLater(_log(c[1].id, at, "fault", "50001"), week=WEEK, attempts=1,
                   unknown_attempts=0, not_before=at + timedelta(minutes=10),
                   week_result=WeekResult.RETRYING, error="fault 50001"),
        DeadAsset(_log(c[2].id, at, "consent", "40404"), error="consent 40404"),
    ], run_id="r1", worker="w1", day=date(2026, 11, 30))
    async with engine.connect() as conn:
        rows = {r.user_id: r for r in (await conn.execute(select(schema.consents))).all()}
        logged = (await conn.execute(select(func.count()).select_from(
            schema.call_outcomes))).scalar_one()
    assert rows["u0"].due_week == nxt and rows["u0"].last_scheduled_at is not None
    assert rows["u1"].attempts == 1 and rows["u1"].lease_owner is None
    assert rows["u2"].status == "dead"
    assert logged == 3
    # The retried one is not due before its not_before; the done and the dead never again.
    later = await work.claim(engine, "BANK000001", worker="w1", week=WEEK,
                             now=at + timedelta(minutes=11), limit=10)
    assert [x.user_id for x in later] == ["u1"]
    assert await work.attempted_today(engine, day=date(2026, 11, 30)) == {"BANK000001": 3}


async def test_write_from_a_worker_that_lost_its_lease_changes_nothing(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, 1)
    c = await work.claim(engine, "BANK000001", worker="old", week=WEEK, now=NOW, limit=1,
                         lease=timedelta(seconds=5))
    await work.claim(engine, "BANK000001", worker="new", week=WEEK,
                     now=NOW + timedelta(seconds=6), limit=1)
    await work.apply(engine, [
        Done(_log(c[0].id, NOW, "success", "00000"), next_week=WEEK + timedelta(days=7)),
    ], run_id="r", worker="old", day=date(2026, 11, 30))
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.consents))).one()
    assert row.due_week == WEEK and row.lease_owner == "new"


def _log(cid: int, at: datetime, kind: str, code: str) -> Refreshed:
    return Refreshed(cid, "BANK000001", at, kind, code, "T" * 25, 1, 5)


async def test_attempted_today_counts_distinct_consents_like_the_planner(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, 2)
    day = date(2026, 11, 30)
    for step in range(3):  # consent 1 fails twice, then succeeds; consent 2 once
        at = NOW + timedelta(minutes=11 * step)
        got = await work.claim(engine, "BANK000001", worker="w1", week=WEEK, now=at, limit=2)
        changes: list[Transition] = []
        for c in got:
            if c.user_id == "u0" and step < 2:
                changes.append(RetryLater(_log(c.id, at, "fault", "50001"), week=WEEK,
                                          attempts=step + 1, unknown_attempts=0,
                                          not_before=at + timedelta(minutes=10),
                                          week_result=WeekResult.RETRYING, error="fault"))
            else:
                changes.append(Done(_log(c.id, at, "success", "00000"),
                                    next_week=WEEK + timedelta(days=7)))
        await work.apply(engine, changes, run_id="r", worker="w1", day=day)
    assert await work.attempted_today(engine, day=day) == {"BANK000001": 2}


async def test_the_cluster_tally_reads_attempted_and_held_by_others_together(
    engine: AsyncEngine,
) -> None:
    from batch.cluster.view import tally

    await _seed(engine, 5)
    day = date(2026, 11, 30)
    mine = await work.claim(engine, "BANK000001", worker="me", week=WEEK, now=NOW, limit=1)
    theirs = await work.claim(engine, "BANK000001", worker="w2", week=WEEK, now=NOW, limit=3)
    done = theirs[0]
    await work.apply(engine, [Done(_log(done.id, NOW, "success", "00000"),
                                   next_week=WEEK + timedelta(days=7))],
                     run_id="r2", worker="w2", day=day)
    attempted, held = await tally(engine, day=day, me="me")
    assert attempted == {"BANK000001": 1}
    assert held == {"BANK000001": 2}  # w2's two still leased; mine is not "another's"
    assert mine


async def test_still_due_counts_active_consents_of_the_week_up_to_each_bound(
    engine: AsyncEngine,
) -> None:
    from batch.db.revocation import revoke

    await _seed(engine, 8)
    async with engine.begin() as conn:  # one not due before next week: done for this one
        await conn.execute(schema.consents.update().where(schema.consents.c.user_id == "u7")
                           .values(due_week=WEEK + timedelta(days=7)))
    held = await work.claim(engine, "BANK000001", worker="w2", week=WEEK, now=NOW, limit=2)
    assert [c.user_id for c in held] == ["u0", "u1"]
    async with engine.connect() as conn:
        u2 = (await conn.execute(select(schema.consents.c.id).where(
            schema.consents.c.user_id == "u2"))).scalar_one()
    assert (await revoke(engine, now=NOW, ids=[u2])).revoked == 1
    # u0..u6 less u2 revoked: 6 due (u0 and u1 leased by w2 among them)
    assert await work.still_due(engine, week=WEEK, bounds={"BANK000001": 100}) == {
        "BANK000001": 6}
    assert await work.still_due(engine, week=WEEK, bounds={"BANK000001": 4}) == {
        "BANK000001": 4}
    assert await work.still_due(engine, week=WEEK, bounds={"BANK000001": 100},
                                holder="me") == {"BANK000001": 4}
    assert await work.still_due(engine, week=WEEK, bounds={"BANK000001": 100},
                                holder="w2") == {"BANK000001": 6}
    # nothing asked of a provider with no bound; an unknown provider has none due
    assert await work.still_due(engine, week=WEEK,
                                bounds={"BANK000001": 0, "CARD000009": 5}) == {
        "CARD000009": 0}
