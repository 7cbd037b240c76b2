"""Claims and start marks of many providers made together (``SqlWorkStore``), both backends:
each provider gets exactly what its own claim would have given it, in keyset order."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db import schema, work
from batch.db.engine import make_engine
from tests.sealing import CIPHER, seal

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
WEEK = date(2026, 11, 29)
ORGS = ("BANK000001", "BANK000002", "BANK000003")


async def seed_interleaved(engine: AsyncEngine, n: int) -> None:
    """Three providers, ``n`` consents due this week, their ids interleaved."""
    async with engine.begin() as conn:
        for org in ORGS:
            await conn.execute(insert(schema.institutions).values(
                org_code=org, industry="bank", base_url="http://127.0.0.1:1",
                windows='["0000:2400"]', calls_per_second=10, max_concurrency=5,
                updated_at=NOW))
        # interleaved ids, so a provider's keyset order is not the table's
        await conn.execute(insert(schema.consents), [
            {"user_id": f"u{i}", "org_code": ORGS[i % len(ORGS)],
             "access_token": seal(f"tok-{i}", ORGS[i % len(ORGS)], f"u{i}"),
             "consented_at": NOW - timedelta(days=30), "due_week": WEEK,
             "not_before": NOW - timedelta(days=30), "updated_at": NOW}
            for i in range(n)])


@pytest.mark.parametrize("group", [work.SQLITE_PICK_GROUP, 2])
async def test_claims_of_many_providers_in_one_go_match_their_own_claims(
    engine: AsyncEngine, group: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(work, "SQLITE_PICK_GROUP", group)
    await seed_interleaved(engine, 30)
    async with engine.begin() as conn:
        await conn.execute(insert(schema.dead_assets).values(
            consent_id=4, item_id="acct-x", since=NOW))
    store = work.SqlWorkStore(engine, CIPHER)
    sent: list[str] = []

    def listen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", listen)
    try:
        got = await asyncio.gather(*(
            store.claim(org, worker="w1", week=WEEK, now=NOW, limit=k + 2)
            for k, org in enumerate(ORGS)))
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", listen)
    assert store.transactions["claim"] == 1  # one transaction for the three
    picks = [s for s in sent if "UPDATE" in s.upper() or "SELECT" in s.upper()]
    # PostgreSQL: one statement (and its SET LOCAL); SQLite: a pick per SQLITE_PICK_GROUP
    # providers (a term and a LIMIT each), then one lease and one read for all of them
    sqlite_picks = -(-len(ORGS) // group)
    assert len(picks) == (1 if engine.dialect.name == "postgresql" else sqlite_picks + 2), sent
    for k, (org, claims) in enumerate(zip(ORGS, got, strict=True)):
        assert [c.org_code for c in claims] == [org] * (k + 2)
        assert [c.id for c in claims] == [i + 1 for i in range(30)
                                          if ORGS[i % 3] == org][:k + 2]
        assert all(store.open_access(c) == f"tok-{c.id - 1}" for c in claims)
    assert {c.id: c.dead_items for cs in got for c in cs}[4] == frozenset({"acct-x"})
    # the next claim of one provider continues after its own cursor
    (more,) = await asyncio.gather(store.claim(ORGS[0], worker="w1", week=WEEK, now=NOW,
                                               limit=1, after=got[0][-1].cursor))
    assert [c.id for c in more] == [7]
    async with engine.connect() as conn:
        leased = (await conn.execute(select(schema.consents.c.id).where(
            schema.consents.c.lease_owner == "w1").order_by(schema.consents.c.id))).scalars()
        assert list(leased) == sorted([c.id for cs in got for c in cs] + [7])


async def test_start_marks_of_many_providers_in_one_statement(engine: AsyncEngine) -> None:
    await seed_interleaved(engine, 6)
    store = work.SqlWorkStore(engine, CIPHER)
    claims = await work.claim(engine, ORGS[0], worker="w1", week=WEEK, now=NOW, limit=2)
    others = await work.claim(engine, ORGS[1], worker="w2", week=WEEK, now=NOW, limit=2)
    counts = await asyncio.gather(
        store.mark_started([c.id for c in claims], worker="w1", at=NOW),
        store.mark_started([c.id for c in others], worker="w2", at=NOW),
        store.mark_started([c.id for c in others], worker="w1", at=NOW))  # not w1's
    assert counts == [{c.id for c in claims}, {c.id for c in others}, set()]
    assert store.transactions["mark"] == 1
    async with engine.connect() as conn:
        marked = dict((await conn.execute(select(
            schema.consents.c.id, schema.consents.c.started_at))).all())
    assert {i for i, at in marked.items() if at is not None} == {
        c.id for c in claims + others}


async def test_two_requests_for_one_provider_are_refused(engine: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="one request per provider"):
        await work.claim_many(engine, [work.ClaimRequest(ORGS[0], 1),
                                       work.ClaimRequest(ORGS[0], 1)],
                              worker="w", week=WEEK, now=NOW)


async def test_a_claim_cancelled_while_its_turn_runs_gives_its_consents_back(
    engine: AsyncEngine,
) -> None:
    """One provider's claim is cancelled (its run stopping) while the turn's statement is
    on its way: the others get theirs, and what was leased for it is released, not left
    leased to nobody until the lease ends."""
    await seed_interleaved(engine, 12)
    store = work.SqlWorkStore(engine, CIPHER)
    kept = asyncio.create_task(store.claim(ORGS[0], worker="w1", week=WEEK, now=NOW, limit=2))
    dropped = asyncio.create_task(store.claim(ORGS[1], worker="w1", week=WEEK, now=NOW,
                                              limit=3))
    await asyncio.sleep(0)  # both joined the turn
    dropped.cancel()
    assert len(await kept) == 2
    with pytest.raises(asyncio.CancelledError):
        await dropped
    await store.settle()  # the release is its own small transaction, in the background
    async with engine.connect() as conn:
        leased = (await conn.execute(select(schema.consents.c.org_code).where(
            schema.consents.c.lease_owner == "w1"))).scalars().all()
    assert [o.strip() for o in leased] == [ORGS[0]] * 2


@pytest.mark.parametrize("together", [False, True], ids=["claim", "claim_many"])
async def test_two_workers_claiming_side_by_side_never_lease_a_consent_twice(
        engine: AsyncEngine, db_url: str, together: bool) -> None:
    """Two workers (two engines, two connection pools) claim the same providers at the
    same moments, each walking its own keyset cursor: every consent is leased exactly
    once, and between them they lease every one."""
    await seed_interleaved(engine, 300)
    other = make_engine(db_url)
    leased: dict[str, list[int]] = {"w1": [], "w2": []}

    async def walk(eng: AsyncEngine, worker: str) -> None:
        cursors = dict.fromkeys(ORGS, work.START)
        for _ in range(100):  # until nothing is left for this worker
            if together:
                got = await work.claim_many(eng, [
                    work.ClaimRequest(org, 7, cursors[org]) for org in ORGS],
                    worker=worker, week=WEEK, now=NOW)
            else:
                got = [await work.claim(eng, org, worker=worker, week=WEEK, now=NOW, limit=7,
                                        after=cursors[org]) for org in ORGS]
            for org, claims in zip(ORGS, got, strict=True):
                leased[worker] += [c.id for c in claims]
                if claims:
                    cursors[org] = claims[-1].cursor
            if not any(got):
                return
            await asyncio.sleep(0)

    try:
        await asyncio.gather(walk(engine, "w1"), walk(other, "w2"))
    finally:
        await other.dispose()
    both = leased["w1"] + leased["w2"]
    assert len(both) == len(set(both)) == 300, (len(both), len(set(both)))
    async with engine.connect() as conn:
        owners = dict((await conn.execute(
            select(schema.consents.c.id, schema.consents.c.lease_owner))).all())
    assert all(owners[i] == w for w, ids in leased.items() for i in ids)
