"""The dispatcher's queries: claim due consents with a lease, mark them started, apply
their lifecycle transitions (``batch.lifecycle``).

Claims are a keyset scan over ``consents_due_idx`` (org_code, due_week, id): backlog weeks
first, then this week's consents in id order; never OFFSET. On PostgreSQL the scan locks with
``FOR UPDATE SKIP LOCKED`` so any number of workers can claim side by side; a claim carries a
lease, so a dead worker's consents come back once it expires. A claim found with an expired
lease from someone else comes back as an unknown outcome only if its first call had started
(``started_at``, set just before the start); otherwise it is plainly due. Counters and the
resume point of another week than the claim's read as none: each week starts fresh.

What a transition writes is said once, in :func:`consent_changes` and the row builders
below; the SQL store and the in-memory twin (``batch.db.memory``) both apply those, each
kind with one lease-guarded statement, so they cannot disagree.

Tokens are sealed at rest (``batch.crypto``). The functions below read and write them as
stored; :class:`SqlWorkStore` is the one seam that seals every token it writes and opens a
claim's access token when its refresh starts (:meth:`SqlWorkStore.open_access`), its refresh
token only if a 40101 needs it (:meth:`SqlWorkStore.open_refresh`), with the
:class:`~batch.crypto.TokenCipher` it is built with: a token that does not open fails its
own consent only, and a claim's rows are not all decrypted in one burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from operator import attrgetter
from typing import Any, NamedTuple, Protocol

from sqlalchemy import (
    BindParameter,
    Date,
    Integer,
    String,
    bindparam,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.client import Progress
from batch.crypto import ACCESS_TOKEN, REFRESH_TOKEN, TokenCipher, TokenColumn, TokenKeyError
from batch.db import bulk
from batch.db.engine import connect, run_transaction
from batch.db.handoff import GilHandoff
from batch.db.schema import (
    UTCDateTime,
    call_outcomes,
    consents,
    dead_letters,
)
from batch.errors import describe
from batch.fastinit import fast_init
from batch.lifecycle import (
    AlreadyTransferred,
    Change,
    DeadAsset,
    DeadLetter,
    Done,
    NotAttempted,
    RetryLater,
    Step,
    TokenRefreshed,
    Transition,
    Unknown,
    WeekResult,
)

log = logging.getLogger("mydata.db")

#: The keyset cursor: the last (due_week, id) handed out.
Cursor = tuple[date, int]
START: Cursor = (date(1970, 1, 1), 0)


@fast_init
@dataclass(frozen=True, slots=True)
class Claim:
    """One leased consent, ready to refresh. Its tokens are as stored (the SQL store's are
    sealed: ``WorkStore.open_access`` and ``open_refresh`` open them) and never appear in
    its repr.

    ``attempts``/``unknown_attempts`` and ``progress`` are this week's (another week's read
    as none). ``stale``: it came back from a worker that had started calling it.
    """

    id: int
    org_code: str
    user_id: str
    due_week: date
    attempts: int
    unknown_attempts: int
    stale: bool
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False, default=None)
    #: where this week's transfer stopped, if it did (batch.client.Progress)
    progress: Progress | None = None
    #: item ids known dead: never called on schedule
    dead_items: frozenset[str] = frozenset()

    @property
    def cursor(self) -> Cursor:
        return (self.due_week, self.id)


#: A consent a claim may lease now: active, due this week or before, not waiting, and not
#: leased (or its lease expired). Every claim form picks by it; SQLite's lease checks it again.
_CLAIMABLE = """status = 'active' AND due_week <= :wk AND not_before <= :now
      AND (lease_until IS NULL OR lease_until < :now)"""
#: A claimable consent's previous holder had started calling it (an unknown outcome).
_STALE = "(lease_owner IS NOT NULL AND started_at IS NOT NULL) AS stale"

def _due(tag: str = "") -> str:
    """Due, unleased (or lease expired) consents of one provider after the keyset cursor;
    ``tag`` ends the provider's own parameter names (several providers in one statement)."""
    return f"""
    FROM consents
    WHERE org_code = :org{tag} AND {_CLAIMABLE}
      AND (due_week, id) > (:cur_week{tag}, :cur_id{tag})
    ORDER BY due_week, id
    LIMIT :n{tag}
"""


def _due_params(tag: str = "") -> tuple[BindParameter[Any], ...]:
    """The types of ``_due(tag)``'s own parameters (``wk`` and ``now`` are shared)."""
    return (bindparam(f"org{tag}", type_=String), bindparam(f"cur_week{tag}", type_=Date),
            bindparam(f"cur_id{tag}", type_=Integer), bindparam(f"n{tag}", type_=Integer))


_DUE = _due()
_PICK_PARAMS = (
    *_due_params(), bindparam("wk", type_=Date), bindparam("now", type_=UTCDateTime),
)

#: Lease what ``picked`` holds: counters and resume point of another week read as none, an
#: unknown outcome counted when the previous holder had started calling (both claim forms).
#: The rows are found again by their physical address (``ctid``), which the row lock taken
#: in ``picked`` keeps: no second walk down the primary key for each (0.5-1 ms of a
#: 700-row claim). A row updated by another transaction between its lock and this (it cannot be)
#: would only be left out of this claim.
_LEASE_PICKED = """
    UPDATE consents AS c
    SET lease_owner = :worker, lease_until = :until, started_at = NULL, counters_week = :wk,
        attempts = CASE WHEN c.counters_week = :wk THEN c.attempts ELSE 0 END,
        unknown_attempts = CASE WHEN c.counters_week = :wk THEN c.unknown_attempts ELSE 0 END
            + CASE WHEN picked.stale THEN 1 ELSE 0 END,
        pending_items = CASE WHEN c.counters_week = :wk THEN c.pending_items END
    FROM picked
    WHERE c.ctid = picked.tid
"""

# A claim starts the consent's week afresh if its counters belong to another week, and
# counts an unknown outcome only when the previous holder had started calling it.
_PG_CLAIM = text(
    f"""
    WITH picked AS (
        SELECT ctid AS tid, {_STALE} {_DUE}
        FOR UPDATE SKIP LOCKED
    )
    {_LEASE_PICKED}
    RETURNING c.id, c.user_id, c.due_week, c.attempts, c.unknown_attempts, picked.stale,
              c.access_token, c.refresh_token, c.pending_items,
              (SELECT array_agg(d.item_id) FROM dead_assets AS d
               WHERE d.consent_id = c.id) AS dead_items
    """
).bindparams(*_PICK_PARAMS, bindparam("until", type_=UTCDateTime),
             bindparam("worker", type_=String))

# SQLite has one writer at a time: pick, then lease, then read, in the same transaction.
# Each statement answers in one row (a JSON array): the driver's thread steps each result row
# with the GIL released and taken back, and a thread that must take the GIL back from a
# busy event loop waits up to the switch interval (5 ms) each time: a 700-row claim took
# 60 s against a busy loop when read row by row (batch/db/bulk.py says more).
#: providers picked per SQLite statement: one compound SELECT, a term (and a LIMIT) per
#: provider (SQLite allows 500 terms and 32,766 parameters; this takes 4 a term). One
#: statement per provider was 95 statements a second with 300 providers, each a hop to the
#: driver's thread and back with the loop's GIL hand-off on (tests/bench/test_many_providers.py)
SQLITE_PICK_GROUP = 50
_sqlite_picks: dict[int, str] = {}


def _sqlite_pick(n: int) -> str:
    """The pick for ``n`` providers: each one's ``_due`` rows (its cursor, its limit), as
    one JSON array of [id, stale, k] (k: the provider's place in the request).

    Plain SQL with SQLite's own named parameters, sent as it is (``exec_driver_sql``) with
    the values already in their stored form (:func:`_sqlite_pick_params`): as a ``text()``
    with typed parameters, SQLAlchemy compiled each new ``n`` (up to SQLITE_PICK_GROUP of
    them) in one step of the loop, 10 ms for 50 providers, and the 300-provider run's
    claims were the loop's longest steps."""
    sql = _sqlite_picks.get(n)
    if sql is None:
        terms = " UNION ALL ".join(
            f"SELECT * FROM (SELECT id, {_STALE}, {k} AS k {_due(f'_{k}')})"
            for k in range(n))
        sql = _sqlite_picks[n] = (
            f"SELECT json_group_array(json_array(id, stale, k)) FROM ({terms})")
    return sql


def _sqlite_pick_params(dialect: Dialect, group: Sequence[ClaimRequest],
                        common: dict[str, object]) -> dict[str, object]:
    """:func:`_sqlite_pick`'s parameters (``common``'s ``wk`` and ``now``, then each
    request's), each in the form SQLAlchemy stores its column's values (a date and a time
    as text: SQLite compares them as text)."""
    day, time_ = bulk._sqlite_processors(dialect, consents, ("due_week", "not_before"))
    assert day is not None and time_ is not None
    params: dict[str, object] = {"wk": day(common["wk"]), "now": time_(common["now"])}
    for k, r in enumerate(group):
        params[f"org_{k}"] = r.org_code
        params[f"cur_week_{k}"] = day(r.after[0])
        params[f"cur_id_{k}"] = r.after[1]
        params[f"n_{k}"] = r.limit
    return params


# The pick runs before the driver opens the transaction (pysqlite opens one at the first
# write), so another process on the same file may lease a picked row in between: the lease
# checks again that each row is still free and due, and the read returns only what this
# lease took (two workers side by side: tests/db/test_claims_together.py).
_SQLITE_LEASE = text(f"""
    UPDATE consents
    SET lease_owner = :worker, lease_until = :until, started_at = NULL, counters_week = :wk,
        attempts = CASE WHEN counters_week = :wk THEN attempts ELSE 0 END,
        unknown_attempts = CASE WHEN counters_week = :wk THEN unknown_attempts ELSE 0 END
            + CASE WHEN id IN (SELECT value FROM json_each(:stale)) THEN 1 ELSE 0 END,
        pending_items = CASE WHEN counters_week = :wk THEN pending_items END
    WHERE id IN (SELECT value FROM json_each(:ids)) AND {_CLAIMABLE}
""").bindparams(bindparam("wk", type_=Date), bindparam("until", type_=UTCDateTime),
                bindparam("now", type_=UTCDateTime), bindparam("worker", type_=String))
_SQLITE_READ = text("""
    SELECT json_group_array(json_array(
        id, user_id, due_week, attempts, unknown_attempts, access_token, refresh_token,
        pending_items, json((SELECT json_group_array(item_id) FROM dead_assets
                             WHERE consent_id = consents.id))))
    FROM consents WHERE id IN (SELECT value FROM json_each(:ids))
      AND lease_owner = :worker AND lease_until = :until
""").bindparams(bindparam("until", type_=UTCDateTime), bindparam("worker", type_=String))


class _ClaimRow(NamedTuple):
    """A claim statement's row, as ``_claims_of`` reads it: positionally, in the order of
    the PostgreSQL statements' RETURNING (SQLite's JSON form is made into these)."""

    id: int
    user_id: str
    due_week: str
    attempts: int
    unknown_attempts: int
    stale: bool
    access_token: str
    refresh_token: str | None
    pending_items: str | None
    dead_items: list[str] | None


async def claim(
    engine: AsyncEngine,
    org_code: str,
    *,
    worker: str,
    week: date,
    now: datetime,
    limit: int,
    after: Cursor = START,
    lease: timedelta = timedelta(minutes=10),
) -> list[Claim]:
    """Lease up to ``limit`` due consents of ``org_code`` after ``after``, in keyset order."""
    if limit <= 0:
        return []
    params = {
        "org": org_code, "wk": week, "cur_week": after[0], "cur_id": after[1], "now": now,
        "n": limit, "worker": worker, "until": now + lease,
    }
    return _claims_of(await run_transaction(engine, _claim_tx, org_code, limit, after, params),
                      org_code)


def _claim_tx(conn: Connection, org_code: str, limit: int, after: Cursor,
              params: dict[str, Any]) -> Sequence[Any]:
    if conn.dialect.name == "postgresql":
        # A lease is soft state: if the server crashed before this commit reached disk,
        # the consent is merely unleased again (and a repeat call meets the provider's
        # 42901), so the claim need not wait for the WAL flush. Outcomes, which are not
        # soft, keep synchronous commits.
        # The dead items ride along in the same statement (one round trip).
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
        return conn.execute(_PG_CLAIM, params).all()
    return _sqlite_claim(conn, [ClaimRequest(org_code, limit, after)],
                         common=params).get(org_code, [])


def _claims_of(rows: Iterable[Any], org_code: str) -> list[Claim]:
    """Claims from the claim statement's rows (the token columns are read here only)."""
    # Rows unpacked by position and Claims built with positional arguments: reading each
    # row's columns by name took 3.6 ms of the event loop per 700-row claim (now 1.4 ms).
    claims = [
        Claim(cid, org_code, user, wk if type(wk) is date else _as_date(wk), att, unk,
              bool(stale), acc, ref, Progress.from_json(pend) if pend else None,
              frozenset(map(str, dead)) if dead else _NO_ITEMS)
        for cid, user, wk, att, unk, stale, acc, ref, pend, dead, *_ in rows
    ]
    claims.sort(key=_keyset_order)
    return claims


_NO_ITEMS: frozenset[str] = frozenset()
_keyset_order = attrgetter("due_week", "id")


#: One claim statement for many providers (PostgreSQL): per request (org, cursor, limit),
#: the same keyset scan as ``_PG_CLAIM`` through a LATERAL join, locked and leased together.
_PG_CLAIM_MANY = text(
    f"""
    WITH req AS (
        SELECT * FROM unnest(CAST(:orgs AS char(10)[]), CAST(:cur_weeks AS date[]),
                             CAST(:cur_ids AS bigint[]), CAST(:ns AS integer[]))
            AS r(org, cur_week, cur_id, n)
    ), picked AS (
        SELECT p.tid, p.stale FROM req CROSS JOIN LATERAL (
            SELECT ctid AS tid, {_STALE}
            FROM consents
            WHERE org_code = req.org AND {_CLAIMABLE}
              AND (due_week, id) > (req.cur_week, req.cur_id)
            ORDER BY due_week, id
            LIMIT req.n
            FOR UPDATE SKIP LOCKED
        ) AS p
    )
    {_LEASE_PICKED}
    RETURNING c.id, c.user_id, c.due_week, c.attempts, c.unknown_attempts, picked.stale,
              c.access_token, c.refresh_token, c.pending_items,
              (SELECT array_agg(d.item_id) FROM dead_assets AS d
               WHERE d.consent_id = c.id) AS dead_items,
              c.org_code
    """
).bindparams(bindparam("wk", type_=Date), bindparam("now", type_=UTCDateTime),
             bindparam("until", type_=UTCDateTime), bindparam("worker", type_=String))


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One provider's claim, to be made together with others (:func:`claim_many`)."""

    org_code: str
    limit: int
    after: Cursor = START


async def claim_many(
    engine: AsyncEngine,
    requests: Sequence[ClaimRequest],
    *,
    worker: str,
    week: date,
    now: datetime,
    lease: timedelta = timedelta(minutes=10),
) -> list[list[Claim]]:
    """:func:`claim` for several providers (one request each) in one transaction, on
    PostgreSQL in one statement; the claims of each request, in keyset order."""
    rows = await claim_rows(engine, requests, worker=worker, week=week, now=now, lease=lease)
    return await claims_by_request(requests, rows)


async def claim_rows(
    engine: AsyncEngine,
    requests: Sequence[ClaimRequest],
    *,
    worker: str,
    week: date,
    now: datetime,
    lease: timedelta = timedelta(minutes=10),
) -> dict[str, list[Any]]:
    """:func:`claim_many`'s transaction: the claimed rows per provider, not yet made into
    claims (:func:`claims_by_request`, after the transaction)."""
    if len({r.org_code for r in requests}) != len(requests):
        raise ValueError("one request per provider")
    asked = [r for r in requests if r.limit > 0]
    if not asked:
        return {}
    return await run_transaction(engine, _claim_rows_tx, asked, {
        "wk": week, "now": now, "worker": worker, "until": now + lease})


def _claim_rows_tx(conn: Connection, asked: Sequence[ClaimRequest],
                   common: dict[str, Any]) -> dict[str, list[Any]]:
    if conn.dialect.name != "postgresql":
        return _sqlite_claim(conn, asked, common=common)
    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")  # see claim()
    by_org: dict[str, list[Any]] = defaultdict(list)
    for row in conn.execute(_PG_CLAIM_MANY, {
            "orgs": [r.org_code for r in asked], "cur_weeks": [r.after[0] for r in asked],
            "cur_ids": [r.after[1] for r in asked], "ns": [r.limit for r in asked],
            **common}):  # one statement for all
        by_org[row[10].rstrip()].append(row)  # org_code, last: char(10)
    return by_org


async def claims_by_request(requests: Sequence[ClaimRequest],
                            by_org: dict[str, list[Any]]) -> list[list[Claim]]:
    """The claims of each request from :func:`claim_rows`' rows, WAKE_GROUP providers per
    turn of the loop (300 providers' claims on SQLite were one 11 ms step, inside the
    transaction). The store makes them outside its SQLite turn, so that the next claim,
    start mark or write need not wait for them."""
    found: dict[str, list[Claim]] = {}
    if by_org:
        for k, r in enumerate(requests):
            if k and k % WAKE_GROUP == 0:
                await asyncio.sleep(0)  # hundreds of providers: let the due ticks run
            rows = by_org.get(r.org_code)
            if rows:
                found[r.org_code] = _claims_of(rows, r.org_code)
    return [found.get(r.org_code, []) for r in requests]


def _sqlite_claim(conn: Connection, requests: Sequence[ClaimRequest], *,
                  common: dict[str, object]) -> dict[str, list[Any]]:
    """Pick each provider's claims (a LIMIT per provider, SQLITE_PICK_GROUP providers a
    statement), then lease and read all of them at once (one statement each), every
    statement answering in one row; the claimed rows per provider. ``common``: ``wk``,
    ``now``, ``worker``, ``until``."""
    org_of: dict[int, str] = {}
    stale: set[int] = set()
    for start in range(0, len(requests), SQLITE_PICK_GROUP):
        group = requests[start:start + SQLITE_PICK_GROUP]
        params = _sqlite_pick_params(conn.dialect, group, common)
        for i, st, k in json.loads(conn.exec_driver_sql(
                _sqlite_pick(len(group)), params).scalar_one()):
            org_of[i] = group[k].org_code
            if st:
                stale.add(i)
    if not org_of:
        return {}
    ids = json.dumps(list(org_of))
    conn.execute(_SQLITE_LEASE, {
        "worker": common["worker"], "until": common["until"], "wk": common["wk"],
        "now": common["now"], "stale": json.dumps(sorted(stale)), "ids": ids})
    rows: dict[str, list[Any]] = defaultdict(list)
    for cid, user, wk, att, unk, acc, ref, pend, items in json.loads(
            conn.execute(_SQLITE_READ, {
                "ids": ids, "worker": common["worker"], "until": common["until"]}
            ).scalar_one()):
        rows[org_of[cid]].append(
            _ClaimRow(cid, user, wk, att, unk, cid in stale, acc, ref, pend, items))
    return rows


def _as_date(v: object) -> date:
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    return date.fromisoformat(str(v))


async def release(engine: AsyncEngine, ids: Sequence[int], *, worker: str) -> int:
    """Give back unstarted claims (graceful stop): they are due again at once."""
    if not ids:
        return 0
    return len(await run_transaction(engine, bulk.set_where_held, ids, worker=worker,
                                     values=RELEASED))


async def extend(engine: AsyncEngine, ids: Sequence[int], *, worker: str,
                 until: datetime) -> int:
    """Renew our leases on claims still queued or in flight (a heartbeat)."""
    if not ids:
        return 0
    return len(await run_transaction(engine, bulk.set_where_held, ids, worker=worker,
                                     values={"lease_until": until}))


async def mark_started(engine: AsyncEngine, ids: Sequence[int], *, worker: str,
                       at: datetime) -> int:
    """Mark claims about to be called: only these can come back as unknown after a crash.
    Marked a little early (the coming second's claims at once), never late."""
    marked = await mark_started_many(engine, [(ids, worker)], at=at)
    return len(marked.get(worker, ()))


async def mark_started_many(engine: AsyncEngine, marks: Sequence[tuple[Sequence[int], str]],
                            *, at: datetime) -> dict[str, set[int]]:
    """Start marks of many callers (ids, worker) in one transaction, one statement per
    worker (the first mark's time kept): per worker, the ids actually marked (still leased
    by it)."""
    by_worker: dict[str, list[int]] = defaultdict(list)
    for ids, worker in marks:
        by_worker[worker].extend(ids)
    return await run_transaction(engine, _marks_tx, by_worker, at)


def _marks_tx(conn: Connection, by_worker: dict[str, list[int]],
              at: datetime) -> dict[str, set[int]]:
    done: dict[str, set[int]] = defaultdict(set)
    for worker, ids in by_worker.items():
        done[worker].update(bulk.set_where_held(conn, ids, worker=worker,
                                                values={"started_at": at},
                                                only_unset="started_at"))
    return done


# -- what each transition writes (said once; both stores apply exactly this) ----------------

#: the lease and the start mark, cleared by every transition and by a release
RELEASED: dict[str, Any] = {"lease_owner": None, "lease_until": None, "started_at": None}


#: the columns each kind of transition sets (:func:`consent_change_values`), by shape
_RELEASED_COLS = (*RELEASED, "updated_at")
_RELEASED_VALUES = tuple(RELEASED.values())
_FRESH_WEEK_COLS = ("attempts", "unknown_attempts", "counters_week", "pending_items")
_FRESH_WEEK_VALUES = (0, 0, None, None)
_DONE_COLS = (*_RELEASED_COLS, *_FRESH_WEEK_COLS, "due_week", "last_scheduled_at",
              "week_result", "last_error")
_WEEK_OVER_COLS = (*_RELEASED_COLS, *_FRESH_WEEK_COLS, "due_week", "week_result",
                   "last_error")
_DEAD_ASSET_COLS = (*_RELEASED_COLS, "status", "pending_items", "week_result", "last_error")
_RETRY_COLS = (*_RELEASED_COLS, "attempts", "unknown_attempts", "counters_week", "not_before",
               "week_result", "last_error", "pending_items")
_NOT_ATTEMPTED_COLS = (*_RELEASED_COLS, "pending_items")
_DONE_RESULT = WeekResult.DONE.value
_DEAD_ASSET_RESULT = WeekResult.DEAD_ASSET.value


def consent_change_values(t: Transition) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The consent columns ``t`` sets and their values, to absolute values (so every store
    agrees): a tuple each, no dict (a flush makes one per refresh; :func:`prepare_apply`
    sends them as columns)."""
    at = t.log.at
    match t:
        case Done():
            return _DONE_COLS, (*_RELEASED_VALUES, at, *_FRESH_WEEK_VALUES, t.next_week, at,
                                _DONE_RESULT, None)
        case AlreadyTransferred():
            return _WEEK_OVER_COLS, (*_RELEASED_VALUES, at, *_FRESH_WEEK_VALUES, t.next_week,
                                     t.week_result.value, t.error)
        case DeadLetter():
            return _WEEK_OVER_COLS, (*_RELEASED_VALUES, at, *_FRESH_WEEK_VALUES, t.next_week,
                                     t.why.value, t.error)
        case DeadAsset():
            return _DEAD_ASSET_COLS, (*_RELEASED_VALUES, at, "dead", None, _DEAD_ASSET_RESULT,
                                      t.error)
        case RetryLater() | Unknown():
            return _RETRY_COLS, (*_RELEASED_VALUES, at, t.attempts, t.unknown_attempts, t.week,
                                 t.not_before, t.week_result.value, t.error,
                                 _progress(t.progress))
        case NotAttempted():
            return _NOT_ATTEMPTED_COLS, (*_RELEASED_VALUES, at, _progress(t.progress))
    raise TypeError(f"not a transition: {t!r}")


def consent_changes(t: Transition) -> dict[str, Any]:
    """The consent columns ``t`` sets, to absolute values (so every store agrees)."""
    cols, values = consent_change_values(t)
    return dict(zip(cols, values, strict=True))


def token_changes(t: TokenRefreshed) -> dict[str, Any]:
    """The token columns a refreshed pair sets (a pair without a refresh token keeps it).

    Every store sets them on any holder's row (not lease-guarded: see TokenRefreshed) but
    never on a revoked one: ``revoke`` may land while the consent's call is in flight, and
    its tokens stay erased (a 40101 answered after it would otherwise seal a new pair into
    the revoked row)."""
    out = {"access_token": t.access_token}
    if t.refresh_token is not None:
        out["refresh_token"] = t.refresh_token
    return out


def outcome_values(t: Transition, *, run_id: str, day: date) -> tuple[Any, ...]:
    """The ``call_outcomes`` row of one refresh, in ``bulk.OUTCOME_COLS``' order."""
    g = t.log
    return (run_id, g.consent_id, g.org_code, day, g.tran_id, g.kind, t.step._value_,
            g.rsp_code, g.calls, g.elapsed_ms, g.at)


def outcome_row(t: Transition, *, run_id: str, day: date) -> dict[str, Any]:
    """The ``call_outcomes`` row of one refresh (written whoever holds the lease now)."""
    return dict(zip(bulk.OUTCOME_COLS, outcome_values(t, run_id=run_id, day=day), strict=True))


def dead_letter_row(t: DeadLetter) -> dict[str, Any]:
    return {"consent_id": t.consent_id, "org_code": t.org_code, "week_start": t.week,
            "attempts": t.attempts, "last_error": t.error, "entered_at": t.at,
            "requeued_at": None}


def dead_asset_rows(t: Transition) -> list[dict[str, Any]]:
    return [{"consent_id": t.consent_id, "item_id": i, "since": t.at}
            for i in sorted(set(t.log.dead_items))]


def _progress(p: Progress | None) -> str | None:
    return p.to_json() if p is not None else None


@dataclass(frozen=True, slots=True)
class Batch:
    """One write, sorted for the store: what changes on which held consent."""

    transitions: tuple[Transition, ...]
    tokens: tuple[TokenRefreshed, ...]

    @classmethod
    def of(cls, changes: Iterable[Change]) -> Batch:
        ts: list[Transition] = []
        toks: list[TokenRefreshed] = []
        for ch in changes:
            if isinstance(ch, TokenRefreshed):
                toks.append(ch)
            else:
                ts.append(ch)
        return cls(tuple(ts), tuple(toks))

    def held(self, leased: set[int]) -> list[Transition]:
        """The transitions whose consent is still leased by us (the only ones applied)."""
        return [t for t in self.transitions if t.log.consent_id in leased]

    def ids(self) -> list[int]:
        return sorted({t.log.consent_id for t in self.transitions})


def by_kind(ts: Iterable[Transition]) -> dict[type, list[Transition]]:
    """Transitions grouped by kind, in a fixed order (one statement each)."""
    groups: dict[type, list[Transition]] = defaultdict(list)
    for t in ts:
        groups[type(t)].append(t)
    return dict(sorted(groups.items(), key=lambda kv: kv[0].__name__))


#: transitions made ready for their statements per turn of the event loop (a flush of
#: hundreds at once cost 3.5 ms of the loop's time in one piece: every slice tick due then
#: waited for it)
PREPARE_GROUP = 64


@dataclass(frozen=True, slots=True)
class PreparedApply:
    """A batch made ready for its transaction (:func:`prepare_apply`): the consent updates
    (one per kind and shape) and the outcome log's insert, every parameter made."""

    batch: Batch
    updates: tuple[bulk.Prepared, ...]
    logged: bulk.Prepared


async def apply(engine: AsyncEngine, changes: Sequence[Change], *, run_id: str, worker: str,
                day: date) -> None:
    """Apply a batch in one transaction: consent rows (one lease-guarded statement per
    kind and shape: only rows still leased by ``worker``), tokens, dead assets, dead
    letters and the outcome log (``batch.db.bulk``: multi-row statements). A late write from
    a worker whose lease expired changes no consent."""
    if changes:
        await write_prepared(engine, await prepare_apply(engine.dialect, changes,
                                                          run_id=run_id, worker=worker, day=day))


async def prepare_apply(dialect: Dialect, changes: Sequence[Change], *, run_id: str,
                        worker: str, day: date) -> PreparedApply:
    """:func:`apply`'s statements, made before its transaction opens, PREPARE_GROUP
    transitions per turn of the loop. The store makes them outside its SQLite turn: on a
    saturated loop the turns of a 2,000-outcome flush held the turn (and every start mark
    and claim waiting for it) for 390 ms at the median."""
    batch = Batch.of(changes)
    shapes: dict[tuple[str, tuple[str, ...]], tuple[list[int], list[tuple[Any, ...]]]] = {}
    outcomes: list[tuple[Any, ...]] = []
    for k, t in enumerate(batch.transitions):
        if k and k % PREPARE_GROUP == 0:
            await asyncio.sleep(0)
        cols, values = consent_change_values(t)
        ids, rows = shapes.setdefault((type(t).__name__, cols), ([], []))
        ids.append(t.log.consent_id)  # (the log's own: the property is a frame a row)
        rows.append(values)
        outcomes.append(outcome_values(t, run_id=run_id, day=day))
    # The statements too, a turn of the loop each: inside the transaction its turns only
    # send them (a 300-row flush's outcome insert, built there, was one 3-5 ms step).
    updates: list[bulk.Prepared] = []
    for key in sorted(shapes):  # one statement per kind and shape, in a fixed order
        await asyncio.sleep(0)
        ids, rows = shapes[key]
        updates.append(bulk.prepare_update_columns(dialect, ids, key[1], _columns(rows),
                                                   worker=worker))
    await asyncio.sleep(0)
    logged = bulk.prepare_outcomes_columns(dialect, _columns(outcomes))
    await asyncio.sleep(0)  # the transaction's opening in a turn of its own
    return PreparedApply(batch, tuple(updates), logged)


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows of one shape as its columns (a list each), transposed in C."""
    return [list(c) for c in zip(*rows, strict=True)]


async def write_prepared(engine: AsyncEngine, p: PreparedApply) -> None:
    """:func:`apply`'s transaction, its statements already made."""
    await run_transaction(engine, _apply_tx, p)


def _apply_tx(conn: Connection, p: PreparedApply) -> None:
    batch = p.batch
    leased: set[int] = set()
    for prepared in p.updates:
        leased |= prepared.run(conn)
    held = batch.held(leased)
    assets = [row for t in held if t.log.dead_items for row in dead_asset_rows(t)]
    if assets:
        conn.execute(_INSERT_DEAD_ASSETS, assets)
    if batch.tokens:
        _update_each(conn, [(t.consent_id, token_changes(t)) for t in batch.tokens],
                     worker=None, not_revoked=True)
    letters = [dead_letter_row(t) for t in held if isinstance(t, DeadLetter)]
    if letters:
        conn.execute(insert(dead_letters), letters)
    p.logged.run(conn)


_INSERT_DEAD_ASSETS = text(
    "INSERT INTO dead_assets (consent_id, item_id, since) "
    "VALUES (:consent_id, :item_id, :since) "
    "ON CONFLICT (consent_id, item_id) DO NOTHING"
).bindparams(bindparam("since", type_=UTCDateTime))


async def save_token(engine: AsyncEngine, t: TokenRefreshed) -> bool:
    """Store a refreshed token pair now, in its own small transaction (before the retry),
    unless the consent was revoked meanwhile (see :func:`token_changes`): False then."""
    return await run_transaction(engine, _save_token_tx, t.consent_id, token_changes(t))


#: the token writes' guard (:func:`token_changes`): a revoked row keeps its tokens erased
_NOT_REVOKED = consents.c.status != "revoked"


def _save_token_tx(conn: Connection, consent_id: int, values: dict[str, Any]) -> bool:
    c = consents.c
    res = conn.execute(update(consents).where(c.id == consent_id, _NOT_REVOKED)
                       .values(values))
    return bool(res.rowcount)


def _update_each(conn: Connection, rows: Sequence[tuple[int, dict[str, Any]]],
                 *, worker: str | None, not_revoked: bool = False) -> None:
    """One executemany per set of columns; guarded by the lease when ``worker`` is given,
    and ``not_revoked`` leaves a revoked consent's row as the revocation left it."""
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for cid, values in rows:
        shapes[tuple(sorted(values))].append(
            {"b_id": cid, **{f"b_{k}": v for k, v in values.items()}})
    c = consents.c
    for cols, params in shapes.items():
        stmt = update(consents).where(c.id == bindparam("b_id"))
        if worker is not None:
            stmt = stmt.where(c.lease_owner == worker)
        if not_revoked:
            stmt = stmt.where(_NOT_REVOKED)
        conn.execute(stmt.values({k: bindparam(f"b_{k}") for k in cols}), params)


async def attempted_today(engine: AsyncEngine, *, day: date) -> dict[str, int]:
    """Consents already attempted today per provider (a restarted run resumes from here).

    Distinct consents, as the planner counts them: a consent retried today is one."""
    co = call_outcomes.c
    async with engine.connect() as conn:
        rows = (await conn.execute(
            select(co.org_code, func.count(func.distinct(co.consent_id)))
            .where(co.day == day, co.action != Step.NOT_ATTEMPTED.value)
            .group_by(co.org_code)
        )).all()
    return {str(org).strip(): int(n) for org, n in rows}


async def still_due(engine: AsyncEngine, *, week: date, bounds: Mapping[str, int],
                    holder: str | None = None) -> dict[str, int]:
    """Per provider of ``bounds``: its consents still due in ``week`` (active, due that week
    or before: waiting out a retry or leased counts too), counted up to its bound.

    What a run leaves of its day's quota is deferred only while that many are still due: a
    revoke, or another run's refreshes, can leave fewer. Each count walks the due index and
    stops at its bound (a bounded count on 10M consents costs what the bound does).
    ``holder``: leave out consents leased by any other worker (the cluster counts those as in
    their hands)."""
    c = consents.c
    out: dict[str, int] = {}
    async with connect(engine) as conn:
        for org, bound in bounds.items():
            if bound <= 0:
                continue
            due = (select(c.id).where(c.org_code == org, c.status == "active",
                                      c.due_week <= week))
            if holder is not None:
                due = due.where(or_(c.lease_owner.is_(None), c.lease_owner == holder))
            n = (await conn.execute(
                select(func.count()).select_from(due.limit(bound).subquery()))).scalar_one()
            out[org] = int(n)
    return out


class WorkStore(Protocol):
    """What the dispatcher needs from the database (an in-memory twin serves unit tests).

    The contract (tests/db/test_lifecycle_contract.py runs it on every store): ``apply``
    writes a batch in one transaction; each transition's consent changes
    (:func:`consent_changes`) only if the consent is still leased by ``worker``; dead items
    and dead letters likewise; every transition's outcome row; token pairs always.
    """

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: Cursor = START,
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]: ...

    async def release(self, ids: Sequence[int], *, worker: str) -> int: ...

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int: ...

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        """Mark claims about to be called (:func:`mark_started`): the ids of ``ids`` marked,
        those still leased by ``worker`` (not revoked, not taken by another worker)."""
        ...

    async def apply(self, changes: Sequence[Change], *, run_id: str, worker: str,
                    day: date) -> None: ...

    async def save_token(self, t: TokenRefreshed) -> bool:
        """Store a refreshed pair now; False (nothing stored) if the consent is revoked."""
        ...

    def open_access(self, claim: Claim) -> str:
        """The claim's access token in the clear; claims carry their tokens as stored.
        Raises :class:`~batch.crypto.TokenKeyError` for a token that does not open."""
        ...

    def open_refresh(self, claim: Claim) -> str | None:
        """The claim's refresh token in the clear (None if it has none), opened apart from
        the access token: only a refresh that meets a 40101 needs it. Raises
        :class:`~batch.crypto.TokenKeyError` for a token that does not open."""
        ...


#: callers woken per turn of the event loop when one statement answers many of them (the
#: claims and start marks of hundreds of providers): the loop runs its due timers (the 100
#: ms slices' ticks) between two groups instead of after all of them
WAKE_GROUP = 16


async def _wake(answers: Sequence[tuple[asyncio.Future[Any], Any]]) -> None:
    """Resolve each future with its answer, WAKE_GROUP per turn of the loop."""
    try:
        for k, (fut, value) in enumerate(answers):
            if k and k % WAKE_GROUP == 0:
                await asyncio.sleep(0)
            if not fut.done():
                fut.set_result(value)
    finally:  # cancelled part way (shutdown): nobody is left waiting forever
        for fut, _ in answers:
            if not fut.done():
                fut.cancel()


class SqlWorkStore:
    """The real store (SQLite or PostgreSQL): the functions above over one engine, tokens
    sealed with ``cipher`` on the way in and opened as each refresh starts.

    Shared by every provider of a run, it cuts statements where they would grow with the
    number of providers: claims, and start marks, asked for in the same turn of the event
    loop (or while the previous ones are in flight) are made together, one statement for all
    providers, and each caller still returns only once its own are made. On SQLite, whose
    file has one writer at a time, this process's writes take turns on a lock instead of
    meeting on the file's lock (whose busy handler sleeps up to 100 ms per retry), and a
    turn holds the lock only for the transaction itself: the rows of a write are made before
    it (:func:`prepare_apply`) and the claims after it (:func:`claims_by_request`), and the
    transaction runs whole in SQLite's thread (:func:`batch.db.engine.run_transaction`).
    Measured in a saturated SQLite ``run_day`` (2026-12-06): the turns held the lock 58 s
    of the minute (claims 221 ms at the median, start marks 125 ms, writes 393 ms) and the
    starts waited 17-37 s in all for their marks; now 12 s (46, 24 and 50 ms) and 0.1 s.
    """

    def __init__(self, engine: AsyncEngine, cipher: TokenCipher) -> None:
        self.engine = engine
        self.cipher = cipher
        sqlite = engine.dialect.name == "sqlite"
        self._serial: asyncio.Lock | None = asyncio.Lock() if sqlite else None
        self._handoff = GilHandoff()
        self._claims: list[tuple[ClaimRequest, tuple[str, date, timedelta], datetime,
                                 asyncio.Future[list[Claim]]]] = []
        self._claiming: asyncio.Task[None] | None = None
        self._giving_back: set[asyncio.Task[None]] = set()
        self._marks: list[tuple[Sequence[int], str, datetime,
                                asyncio.Future[dict[str, set[int]]]]] = []
        self._marking: asyncio.Task[None] | None = None
        #: statements-in-transactions issued, by kind (benchmarks read it)
        self.transactions: dict[str, int] = defaultdict(int)

    def _turn(self) -> contextlib.AbstractAsyncContextManager[object]:
        return self._sqlite_turn() if self._serial is not None else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def _sqlite_turn(self) -> AsyncIterator[None]:
        """This process's SQLite writes one at a time, the driver's thread handed the GIL
        while they run (batch/db/handoff.py)."""
        assert self._serial is not None
        async with self._serial, self._handoff:
            yield

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: Cursor = START,
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]:
        """Returns once this claim is made, together with the other providers' claims
        of this turn (one statement for all of them on PostgreSQL); tokens as stored,
        sealed (:meth:`open_access` opens a claim's when its refresh starts)."""
        if limit <= 0:
            return []
        done: asyncio.Future[list[Claim]] = asyncio.get_running_loop().create_future()
        self._claims.append((ClaimRequest(org_code, limit, after), (worker, week, lease), now,
                             done))
        if self._claiming is None:
            self._claiming = asyncio.create_task(self._claim_all(), name="claims")
        try:
            got = await asyncio.shield(done)
        except asyncio.CancelledError:
            # The claim goes on for the others of its turn; what it leases for us is
            # given back when it lands, not left leased to nobody until the lease ends.
            done.add_done_callback(lambda f: self._give_back(f, worker))
            raise
        return got

    def _give_back(self, fut: asyncio.Future[list[Claim]], worker: str) -> None:
        if fut.cancelled() or fut.exception() is not None or not fut.result():
            return
        ids = [c.id for c in fut.result()]

        async def release_them() -> None:
            try:
                await self.release(ids, worker=worker)
            except Exception as exc:  # their leases run out instead
                log.warning("could not give back the claims of a cancelled claim", extra={
                    "action": "release_failed", "claims": len(ids), "error": describe(exc)})

        task = asyncio.get_running_loop().create_task(release_them(), name="claims-back")
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def settle(self) -> None:
        """Wait until the claims of cancelled claims are given back (a run's end waits for
        them before it closes the engine, so none stays leased to a worker that left)."""
        while self._giving_back:
            await asyncio.gather(*self._giving_back, return_exceptions=True)

    async def _claim_all(self) -> None:
        try:
            while self._claims:
                await asyncio.sleep(0)  # the other providers' claims of this turn join
                batch, self._claims = self._claims, []
                # one request per provider and statement; a second one waits for the next
                groups: dict[tuple[str, date, timedelta], dict[str, Any]] = defaultdict(dict)
                for item in batch:
                    org = item[0].org_code
                    if org in groups[item[1]]:
                        self._claims.append(item)
                    else:
                        groups[item[1]][org] = item
                for (worker, week, lease), items in groups.items():
                    todo = list(items.values())
                    self.transactions["claim"] += 1
                    try:
                        requests = [req for req, *_ in todo]
                        async with self._turn():
                            rows = await claim_rows(
                                self.engine, requests, worker=worker,
                                week=week, now=min(now for _, _, now, _ in todo),
                                lease=lease)
                        got = await claims_by_request(requests, rows)
                    except Exception as exc:
                        for *_, fut in todo:
                            if not fut.done():
                                fut.set_exception(exc)
                    else:
                        await _wake([(fut, claims) for (*_, fut), claims
                                     in zip(todo, got, strict=True)])
        finally:
            self._claiming = None

    async def release(self, ids: Sequence[int], *, worker: str) -> int:
        self.transactions["release"] += 1
        async with self._turn():
            return await release(self.engine, ids, worker=worker)

    async def extend(self, ids: Sequence[int], *, worker: str, until: datetime) -> int:
        self.transactions["extend"] += 1
        async with self._turn():
            return await extend(self.engine, ids, worker=worker, until=until)

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        """Returns once ``ids`` are marked (with everyone's marks of this turn)."""
        if not ids:
            return set()
        done: asyncio.Future[dict[str, set[int]]] = (
            asyncio.get_running_loop().create_future())
        self._marks.append((list(ids), worker, at, done))
        if self._marking is None:
            self._marking = asyncio.create_task(self._mark_all(), name="start-marks")
        marked = (await asyncio.shield(done)).get(worker, set())
        return {i for i in ids if i in marked}

    async def _mark_all(self) -> None:
        try:
            while self._marks:
                await asyncio.sleep(0)  # the other providers' marks of this turn join
                batch, self._marks = self._marks, []
                self.transactions["mark"] += 1
                try:
                    async with self._turn():
                        # the earliest time asked: a mark may be early, never late
                        marked = await mark_started_many(
                            self.engine, [(ids, w) for ids, w, _, _ in batch],
                            at=min(at for _, _, at, _ in batch))
                except Exception as exc:
                    for *_, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                else:
                    await _wake([(fut, marked) for *_, fut in batch])
        finally:
            self._marking = None

    async def apply(self, changes: Sequence[Change], *, run_id: str, worker: str,
                    day: date) -> None:
        sealed = [self._sealed(ch) if isinstance(ch, TokenRefreshed) else ch
                  for ch in changes]
        if not sealed:
            return
        prepared = await prepare_apply(self.engine.dialect, sealed, run_id=run_id,
                                       worker=worker, day=day)
        self.transactions["apply"] += 1
        async with self._turn():
            await write_prepared(self.engine, prepared)

    async def save_token(self, t: TokenRefreshed) -> bool:
        self.transactions["save_token"] += 1
        async with self._turn():
            return await save_token(self.engine, self._sealed(t))

    def open_access(self, c: Claim) -> str:
        """The claim's access token opened on its own row (consent and column), when its
        refresh starts: a token moved from another row does not open, one TokenKeyError
        line naming the consent (that consent fails alone; the rest of its claim goes on)."""
        return self._open(c, c.access_token, ACCESS_TOKEN)

    def open_refresh(self, c: Claim) -> str | None:
        """The claim's refresh token opened on its own row and column, as
        :meth:`open_access` (only when a 40101 needs it: most refreshes never do)."""
        if c.refresh_token is None:
            return None
        return self._open(c, c.refresh_token, REFRESH_TOKEN)

    def _open(self, c: Claim, stored: str, column: TokenColumn) -> str:
        try:
            return self.cipher.open(stored, c.org_code, c.user_id, column)
        except TokenKeyError as exc:
            raise TokenKeyError(f"consent {c.id}: {exc}") from None

    def _sealed(self, t: TokenRefreshed) -> TokenRefreshed:
        access, refresh = self.cipher.seal_pair(t.org_code, t.user_id, t.access_token,
                                                t.refresh_token)
        return replace(t, access_token=access, refresh_token=refresh)
