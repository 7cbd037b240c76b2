"""The store contract: every lifecycle scenario on the in-memory store, SQLite and
PostgreSQL, with identical consent, outcome, dead-letter and dead-asset rows.

Tokens are compared as the dispatcher sees them: the SQL stores must hold every one sealed
with the store's key (checked on every read of the rows), and are compared once opened; the
in-memory store holds them plain (nothing of it is at rest)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import fields
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.client import Progress, RefreshResult
from batch.crypto import stored_key_id
from batch.db import schema
from batch.db.engine import init_db, make_engine
from batch.db.memory import MemoryConsent, MemoryWorkStore
from batch.db.revocation import ERASED
from batch.db.work import Claim, SqlWorkStore, WorkStore
from batch.dispatch.policy import RetryPolicy
from batch.lifecycle import (
    AlreadyTransferred,
    DeadAsset,
    DeadLetter,
    Done,
    NotAttempted,
    Refreshed,
    RetryLater,
    TokenRefreshed,
    Transition,
    Unknown,
    WeekResult,
    admit,
    decide,
)
from batch.resilience.outcomes import Kind, Outcome
from tests.sealing import CIPHER, seal, unseal

ORG = "BANK000001"
WEEK = date(2026, 11, 29)
LAST_WEEK = WEEK - timedelta(days=7)
NEXT_WEEK = WEEK + timedelta(days=7)
NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
DAY = date(2026, 11, 30)
LEASE = timedelta(minutes=10)
_COLS = [f.name for f in fields(MemoryConsent) if f.name not in ("org_code", "user_id")]


class Harness:
    """One store plus what a scenario needs around it: seeding, poking, reading rows."""

    def __init__(self, name: str, store: WorkStore, engine: AsyncEngine | None) -> None:
        self.name, self.store, self.engine = name, store, engine

    async def seed(self, n: int, *, due_week: date = WEEK) -> None:
        if isinstance(self.store, MemoryWorkStore):
            self.store.add(ORG, n, week=due_week, not_before=NOW - timedelta(days=1),
                           first_id=1)
            for c in self.store.consents.values():
                c.updated_at = NOW - timedelta(days=1)
            return
        assert self.engine is not None
        async with self.engine.begin() as conn:
            await conn.execute(insert(schema.institutions).values(
                org_code=ORG, industry="bank", base_url="http://127.0.0.1:1",
                windows='["0000:2400"]', calls_per_second=10, max_concurrency=5,
                updated_at=NOW))
            await conn.execute(insert(schema.consents), [
                {"id": i, "user_id": f"user{i}", "org_code": ORG,
                 "access_token": seal(f"token-{i}", ORG, f"user{i}"),
                 "consented_at": NOW - timedelta(days=30), "due_week": due_week,
                 "not_before": NOW - timedelta(days=1), "updated_at": NOW - timedelta(days=1)}
                for i in range(1, n + 1)])

    async def poke(self, cid: int, **values: Any) -> None:
        """Set columns directly (a state an earlier week or a crash left behind)."""
        if isinstance(self.store, MemoryWorkStore):
            for k, v in values.items():
                setattr(self.store.consents[cid], k, v)
            return
        assert self.engine is not None
        async with self.engine.begin() as conn:
            await conn.execute(update(schema.consents).where(schema.consents.c.id == cid)
                               .values(**values))

    async def claim(self, worker: str, *, now: datetime = NOW, week: date = WEEK,
                    lease: timedelta = LEASE) -> list[Claim]:
        return await self.store.claim(ORG, worker=worker, week=week, now=now, limit=100,
                                      lease=lease)

    async def apply(self, changes: list[Transition | TokenRefreshed], *, worker: str,
                    run_id: str = "r1") -> None:
        await self.store.apply(changes, run_id=run_id, worker=worker, day=DAY)

    async def rows(self) -> dict[str, list[dict[str, Any]]]:
        if isinstance(self.store, MemoryWorkStore):
            s = self.store
            return _normal({
                "consents": [{k: getattr(c, k) for k in _COLS} for c in s.consents.values()],
                "outcomes": list(s.outcomes), "dead_letters": list(s.dead_letters),
                "dead_assets": list(s.dead_assets.values())})
        assert self.engine is not None
        async with self.engine.connect() as conn:
            cons = [dict(r._mapping) for r in (await conn.execute(
                select(*(schema.consents.c[k] for k in _COLS)))).all()]
            outs = [dict(r._mapping) for r in (await conn.execute(
                select(schema.call_outcomes))).all()]
            letters = [dict(r._mapping) for r in (await conn.execute(
                select(schema.dead_letters))).all()]
            assets = [dict(r._mapping) for r in (await conn.execute(
                select(schema.dead_assets))).all()]
        for r in outs + letters:
            del r["id"]
        for r in cons:
            for k in ("access_token", "refresh_token"):
                if r[k]:  # None (no refresh token) stays None
                    assert stored_key_id(r[k]) == CIPHER.primary_id, (
                        f"{self.name}: consent {r['id']}'s {k} is stored unsealed")
                    # sealed for its own row (seeded as user<id> at ORG) and column
                    r[k] = unseal(r[k], ORG, f"user{r['id']}", k)
        return _normal({"consents": cons, "outcomes": outs, "dead_letters": letters,
                        "dead_assets": assets})


def _normal(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    def value(v: Any) -> Any:
        if isinstance(v, datetime):
            return v.astimezone(UTC)
        if isinstance(v, str):
            return v.strip()
        return v

    return {name: sorted(({k: value(v) for k, v in r.items()} for r in rows),
                         key=lambda r: sorted((k, repr(v)) for k, v in r.items()))
            for name, rows in tables.items()}


@pytest.fixture
async def harnesses(sqlite_url: str, pg_url: str) -> AsyncIterator[list[Harness]]:
    engines = [make_engine(sqlite_url), make_engine(pg_url)]
    for e in engines:
        await init_db(e)
    try:
        yield [Harness("memory", MemoryWorkStore(), None),
               Harness("sqlite", SqlWorkStore(engines[0], CIPHER), engines[0]),
               Harness("postgresql", SqlWorkStore(engines[1], CIPHER), engines[1])]
    finally:
        for e in engines:
            await e.dispose()


Scenario = Callable[[Harness], Awaitable[None]]


async def same_rows(harnesses: list[Harness], scenario: Scenario
                    ) -> dict[str, list[dict[str, Any]]]:
    """Run ``scenario`` on every store; the rows must be identical; returns them."""
    found = {}
    for h in harnesses:
        await scenario(h)
        found[h.name] = await h.rows()
    memory = found["memory"]
    for name, rows in found.items():
        for table in rows:
            assert rows[table] == memory[table], f"{name} differs from memory in {table}"
    return memory


def log(cid: int, kind: str = "success", code: str | None = "00000", *,
        dead: tuple[str, ...] = (), at: datetime = NOW) -> Refreshed:
    return Refreshed(cid, ORG, at, kind, code, f"OPERATOR01M{cid:014d}", 2, 150, dead)


def by_id(rows: dict[str, list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return {int(r["id"]): r for r in rows["consents"]}


# -- every transition kind ------------------------------------------------------------------

async def test_every_transition_kind_writes_the_same_rows_on_every_store(
    harnesses: list[Harness],
) -> None:
    later = NOW + timedelta(minutes=10)

    async def scenario(h: Harness) -> None:
        await h.seed(8)
        await h.claim("w1")
        await h.apply([
            Done(log(1, dead=("A9",)), next_week=NEXT_WEEK),
            AlreadyTransferred(log(2, "consent", "42901"), next_week=NEXT_WEEK,
                               week_result=WeekResult.ALREADY_TRANSFERRED, error="consent 42901"),
            DeadAsset(log(3, "consent", "40404"), error="consent 40404"),
            RetryLater(log(4, "fault", "50001"), week=WEEK, attempts=1, unknown_attempts=0,
                       not_before=later, week_result=WeekResult.RETRYING, error="fault 50001",
                       progress=Progress(("A0", "A1"), "2")),
            Unknown(log(5, "timeout", None), week=WEEK, attempts=1, unknown_attempts=1,
                    not_before=later, error="timeout"),
            NotAttempted(log(6, "rejected", None), progress=Progress(("A3",))),
            DeadLetter(log(7, "client", "40002"), week=WEEK, next_week=NEXT_WEEK, attempts=1,
                       why=WeekResult.FAILED, error="failed: client 40002"),
            TokenRefreshed(8, ORG, "user8", "new-access", "new-refresh"),
        ], worker="w1")

    rows = await same_rows(harnesses, scenario)
    c = by_id(rows)
    assert all(r["lease_owner"] is None and r["started_at"] is None
               for i, r in c.items() if i != 8)
    assert c[1]["due_week"] == NEXT_WEEK and c[1]["last_scheduled_at"] == NOW
    assert c[1]["week_result"] == "done" and c[1]["last_error"] is None
    assert c[2]["due_week"] == NEXT_WEEK and c[2]["last_scheduled_at"] is None
    assert c[3]["status"] == "dead" and c[3]["pending_items"] is None
    assert c[4]["attempts"] == 1 and c[4]["not_before"] == later
    assert Progress.from_json(c[4]["pending_items"]) == Progress(("A0", "A1"), "2")
    assert c[5]["unknown_attempts"] == 1 and c[5]["week_result"] == "unknown"
    assert c[6]["attempts"] == 0 and c[6]["week_result"] is None
    assert c[7]["due_week"] == NEXT_WEEK and c[7]["week_result"] == "failed"
    assert c[8]["access_token"] == "new-access" and c[8]["refresh_token"] == "new-refresh"
    assert c[8]["lease_owner"] == "w1"  # a token pair is not an outcome: still claimed
    assert sorted(r["action"] for r in rows["outcomes"]) == sorted(
        ["done", "done_for_week", "dead_asset", "retry_later", "unknown", "not_attempted",
         "dead_letter"])
    assert [(r["consent_id"], r["week_start"]) for r in rows["dead_letters"]] == [(7, WEEK)]
    assert [(r["consent_id"], r["item_id"]) for r in rows["dead_assets"]] == [(1, "A9")]


async def test_a_worker_that_lost_its_lease_changes_no_consent_but_its_calls_are_logged(
    harnesses: list[Harness],
) -> None:
    async def scenario(h: Harness) -> None:
        await h.seed(1)
        await h.claim("old", lease=timedelta(seconds=5))
        await h.claim("new", now=NOW + timedelta(seconds=6))
        await h.apply([DeadLetter(log(1, "client", "40002", dead=("A1",)), week=WEEK,
                                  next_week=NEXT_WEEK, attempts=1, why=WeekResult.FAILED,
                                  error="failed")], worker="old")

    rows = await same_rows(harnesses, scenario)
    c = by_id(rows)[1]
    assert c["lease_owner"] == "new" and c["due_week"] == WEEK
    assert rows["dead_letters"] == [] and rows["dead_assets"] == []
    assert [r["action"] for r in rows["outcomes"]] == ["dead_letter"]


# -- edge 4: the week boundary ----------------------------------------------------------------

async def test_per_week_counters_do_not_carry_across_the_week_boundary(
    harnesses: list[Harness],
) -> None:
    policy = RetryPolicy(max_attempts=5)
    seen: dict[str, Claim] = {}

    async def scenario(h: Harness) -> None:
        await h.seed(1, due_week=LAST_WEEK)
        # Last week it failed four times and once with an unknown outcome, part way.
        await h.poke(1, attempts=4, unknown_attempts=1, counters_week=LAST_WEEK,
                     pending_items=Progress(("A0",), "1").to_json(), week_result="retrying")
        (c,) = await h.claim("w1")
        seen[h.name] = c
        fault = RefreshResult(Outcome(Kind.FAULT, "50001", 500, retryable=True), calls=1)
        await h.apply([decide(c, fault, week=WEEK, now=NOW, policy=policy)], worker="w1")

    rows = await same_rows(harnesses, scenario)
    assert {(c.attempts, c.unknown_attempts, c.progress) for c in seen.values()} == {
        (0, 0, None)}
    c = by_id(rows)[1]
    assert (c["attempts"], c["counters_week"], c["week_result"]) == (1, WEEK, "retrying")
    assert rows["dead_letters"] == []  # its first failure this week is not its fifth


async def test_a_backlog_consent_42901_this_week_is_not_taken_for_transferred_not_received(
    harnesses: list[Harness],
) -> None:
    async def scenario(h: Harness) -> None:
        await h.seed(1, due_week=LAST_WEEK)
        await h.poke(1, unknown_attempts=1, counters_week=LAST_WEEK)
        (c,) = await h.claim("w1")
        res = RefreshResult(Outcome(Kind.CONSENT, "42901", 429), calls=1)
        await h.apply([decide(c, res, week=WEEK, now=NOW, policy=RetryPolicy())], worker="w1")

    rows = await same_rows(harnesses, scenario)
    assert by_id(rows)[1]["week_result"] == "already_transferred"


# -- edge 2: resume -----------------------------------------------------------------------------

async def test_a_list_stopped_part_way_resumes_from_its_cursor_on_the_next_claim(
    harnesses: list[Harness],
) -> None:
    seen: dict[str, Claim] = {}

    async def scenario(h: Harness) -> None:
        await h.seed(1)
        (c,) = await h.claim("w1")
        res = RefreshResult(Outcome(Kind.FAULT, "50001", 500, retryable=True), calls=2,
                            progress=Progress(("A0", "A1"), "2"))
        await h.apply([decide(c, res, week=WEEK, now=NOW, policy=RetryPolicy())], worker="w1")
        (again,) = await h.claim("w2", now=NOW + timedelta(hours=1))
        seen[h.name] = again

    rows = await same_rows(harnesses, scenario)
    assert {c.progress for c in seen.values()} == {Progress(("A0", "A1"), "2")}
    assert by_id(rows)[1]["lease_owner"] == "w2"


# -- edge 8: crashes ----------------------------------------------------------------------------

async def test_only_a_claim_whose_call_started_comes_back_as_an_unknown_outcome(
    harnesses: list[Harness],
) -> None:
    seen: dict[str, list[tuple[int, bool, int]]] = {}

    async def scenario(h: Harness) -> None:
        await h.seed(2)
        await h.claim("crashed", lease=timedelta(seconds=30))
        await h.store.mark_started([1], worker="crashed", at=NOW)
        back = await h.claim("w2", now=NOW + timedelta(seconds=31))
        seen[h.name] = [(c.id, c.stale, c.unknown_attempts) for c in back]

    rows = await same_rows(harnesses, scenario)
    assert set(map(tuple, seen.values())) == {((1, True, 1), (2, False, 0))}
    assert all(r["started_at"] is None for r in rows["consents"])


async def test_two_crashes_in_a_row_never_dead_letter_a_consent_that_was_never_called(
    harnesses: list[Harness],
) -> None:
    admitted: dict[str, bool] = {}

    async def scenario(h: Harness) -> None:
        await h.seed(1)
        await h.claim("crash1", lease=timedelta(seconds=30))  # queued, never started
        await h.claim("crash2", now=NOW + timedelta(seconds=31), lease=timedelta(seconds=30))
        (c,) = await h.claim("w3", now=NOW + timedelta(seconds=62))
        admitted[h.name] = admit(c, week=WEEK, now=NOW) is None and c.unknown_attempts == 0

    rows = await same_rows(harnesses, scenario)
    assert set(admitted.values()) == {True}
    assert rows["dead_letters"] == []


async def test_a_called_claim_lost_in_two_crashes_is_dead_lettered_once(
    harnesses: list[Harness],
) -> None:
    async def scenario(h: Harness) -> None:
        await h.seed(1)
        t = NOW
        for worker in ("crash1", "crash2"):
            await h.claim(worker, now=t, lease=timedelta(seconds=30))
            await h.store.mark_started([1], worker=worker, at=t)
            t += timedelta(seconds=31)
        (c,) = await h.claim("w3", now=t)
        given_up = admit(c, week=WEEK, now=t)
        assert given_up is not None
        await h.apply([given_up], worker="w3")

    rows = await same_rows(harnesses, scenario)
    assert [r["attempts"] for r in rows["dead_letters"]] == [0]
    assert by_id(rows)[1]["week_result"] == "unknown_twice"
    assert by_id(rows)[1]["due_week"] == NEXT_WEEK


async def test_a_release_gives_back_the_claim_and_its_start_mark(
    harnesses: list[Harness],
) -> None:
    async def scenario(h: Harness) -> None:
        await h.seed(2)
        await h.claim("w1")
        await h.store.mark_started([1, 2], worker="w1", at=NOW)
        assert await h.store.release([1], worker="w1") == 1
        assert await h.store.release([2], worker="someone-else") == 0

    rows = await same_rows(harnesses, scenario)
    c = by_id(rows)
    assert c[1]["lease_owner"] is None and c[1]["started_at"] is None
    assert c[2]["lease_owner"] == "w1" and c[2]["started_at"] == NOW


# -- edge 7: dead assets on detail calls --------------------------------------------------------

async def test_a_dead_asset_found_on_a_detail_call_is_recorded_and_skipped_on_schedule(
    harnesses: list[Harness],
) -> None:
    seen: dict[str, frozenset[str]] = {}

    async def scenario(h: Harness) -> None:
        await h.seed(1)
        (c,) = await h.claim("w1")
        res = RefreshResult(Outcome(Kind.SUCCESS, "00000", 200), calls=4, dead_items=("A1",))
        await h.apply([decide(c, res, week=WEEK, now=NOW, policy=RetryPolicy())], worker="w1")
        (nxt,) = await h.claim("w1", week=NEXT_WEEK, now=NOW + timedelta(days=7))
        seen[h.name] = nxt.dead_items
        # Found dead again (by a provider answering 40404 again): still one row.
        res2 = RefreshResult(Outcome(Kind.SUCCESS, "00000", 200), calls=1, dead_items=("A1",))
        await h.apply([decide(nxt, res2, week=NEXT_WEEK, now=NOW + timedelta(days=7),
                              policy=RetryPolicy())], worker="w1")

    rows = await same_rows(harnesses, scenario)
    assert set(seen.values()) == {frozenset({"A1"})}
    assert [(r["consent_id"], r["item_id"], r["since"]) for r in rows["dead_assets"]] == [
        (1, "A1", NOW)]


# -- edge 12: tokens ----------------------------------------------------------------------------

async def test_a_refreshed_token_is_saved_on_its_own_even_without_the_lease(
    harnesses: list[Harness],
) -> None:
    async def scenario(h: Harness) -> None:
        await h.seed(2)
        await h.claim("w1")
        for t in (TokenRefreshed(1, ORG, "user1", "access-1", "refresh-1"),
                  TokenRefreshed(2, ORG, "user2", "access-2", None)):  # 2: no rotation
            assert await h.store.save_token(t) is True, h.name

    rows = await same_rows(harnesses, scenario)
    c = by_id(rows)
    assert (c[1]["access_token"], c[1]["refresh_token"]) == ("access-1", "refresh-1")
    assert (c[2]["access_token"], c[2]["refresh_token"]) == ("access-2", None)
    assert rows["outcomes"] == []


async def test_a_token_refreshed_after_a_revocation_is_not_stored(
    harnesses: list[Harness],
) -> None:
    """``revoke`` lands while the consent's call is in flight (claimed, started): its 40101
    is answered after, and the refreshed pair (saved on its own, or in a flush) must not
    be sealed into the revoked row, whose tokens the revocation erased."""
    async def scenario(h: Harness) -> None:
        await h.seed(3)
        await h.claim("w1")
        for cid in (1, 2):  # what `revoke` writes (batch/db/revocation.py)
            await h.poke(cid, status="revoked", access_token=ERASED, refresh_token=None,
                         lease_owner=None, lease_until=None, pending_items=None)
        # False: the client makes no retried call (batch/client.py, REVOKED_MEANWHILE)
        assert await h.store.save_token(
            TokenRefreshed(1, ORG, "user1", "access-1", "refresh-1")) is False, h.name
        await h.apply([TokenRefreshed(2, ORG, "user2", "access-2", "refresh-2"),
                       TokenRefreshed(3, ORG, "user3", "access-3", "refresh-3")],
                      worker="w1")

    rows = await same_rows(harnesses, scenario)
    c = by_id(rows)
    assert [(c[i]["status"], c[i]["access_token"], c[i]["refresh_token"])
            for i in (1, 2, 3)] == [("revoked", ERASED, None), ("revoked", ERASED, None),
                                    ("active", "access-3", "refresh-3")]
