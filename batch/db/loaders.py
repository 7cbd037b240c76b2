"""Loaders: institutions, consents and usage history into the database, validated.

Each loader validates every row before anything is written and writes in one transaction,
so a bad file leaves the database as it was. Errors are one line: ``FILE:LINE: field 'x':
what is wrong``. Consents go through a staging table (COPY on PostgreSQL, batched inserts on
SQLite) and one ``INSERT ... SELECT ... ON CONFLICT``: a million rows load in about 25 s on
PostgreSQL on a 2-core machine (``tests/bench/test_load_consents.py``). Access and refresh
tokens are sealed (``batch.crypto``) as the rows are parsed, after the stored tokens were
checked to open with the same keys: the database never holds one in plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert

from batch.clock import KST
from batch.config import Institutions, Provider
from batch.crypto import TokenCipher
from batch.db.csv_input import (
    CsvInput,
    Progress,
    bad_timestamp,
    parse_count,
    parse_day,
)
from batch.db.engine import connect, transaction
from batch.db.marks import mark_loaded
from batch.db.schema import UTCDateTime, consents, institutions, settings, usage_daily
from batch.db.tokens import check_stored_tokens
from batch.errors import ConfigError
from planning.calendar import week_start
from planning.windows import Window, WindowError, parse_windows

CONSENT_COLUMNS = ("user_id", "org_code", "access_token", "consented_at", "last_scheduled_at")
CONSENT_OPTIONAL = ("refresh_token",)
USAGE_COLUMNS = ("org_code", "date", "user_calls")
OPERATOR_KEY = "operator_org_code"
#: Rows parsed and sent to the staging table at a time (bounds memory for huge files).
CHUNK_ROWS = 50_000
#: Provider fields kept in ``institutions.options`` (JSON) with ``Provider.extra``.
_TUNING = tuple(
    f.name for f in fields(Provider)
    if f.name not in {"org_code", "industry", "base_url", "windows", "calls_per_second",
                      "max_concurrency", "extra"}
)


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")


def _upsert(conn: AsyncConnection, table: Any, keys: Sequence[str],
            update: Sequence[str]) -> Insert:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE`` for the connection's dialect."""
    ins: postgresql.Insert | sqlite.Insert = (
        postgresql.insert(table) if conn.dialect.name == "postgresql" else sqlite.insert(table))
    return ins.on_conflict_do_update(
        index_elements=list(keys), set_={c: ins.excluded[c] for c in update})


async def count_consents(engine: AsyncEngine) -> int:
    """How many consents the database holds (any status)."""
    async with connect(engine) as conn:
        return int((await conn.execute(select(func.count()).select_from(consents))).scalar_one())


async def _org_codes(conn: AsyncConnection) -> frozenset[str]:
    rows = await conn.execute(select(institutions.c.org_code))
    return frozenset(r[0].strip() for r in rows)


# --- institutions --------------------------------------------------------------------------

def _options(p: Provider) -> str:
    opts: dict[str, Any] = dict(p.extra)
    opts.update({name: getattr(p, name) for name in _TUNING})
    # TOML dates and times have no JSON form: they are kept as their ISO text.
    return json.dumps(opts, sort_keys=True, default=str)


async def _stored_operator(conn: AsyncConnection) -> str | None:
    value = (await conn.execute(
        select(settings.c.value).where(settings.c.key == OPERATOR_KEY))).scalar()
    return None if value is None else str(value)


async def _active_codes(conn: AsyncConnection) -> list[str]:
    rows = await conn.execute(select(institutions.c.org_code).where(
        institutions.c.retired_at.is_(None)).order_by(institutions.c.org_code))
    return [str(r[0]).strip() for r in rows]


async def missing_providers(engine: AsyncEngine, insts: Institutions) -> list[str]:
    """Active providers in the database that ``insts`` no longer lists."""
    listed = {p.org_code for p in insts.providers}
    async with connect(engine) as conn:
        return [c for c in await _active_codes(conn) if c not in listed]


async def load_institutions(engine: AsyncEngine, insts: Institutions, *, now: datetime,
                            source: str | None = None, retire_missing: bool = False,
                            change_operator: bool = False) -> int:
    """Upsert every provider and the operator's org code in one transaction.

    A provider in the database that ``insts`` no longer lists is refused (it would go on
    being called) unless ``retire_missing``: then it is retired, never planned or run
    again, its consents and history kept. Listing a retired provider again brings it back.
    A changed operator org code (it is in every transaction id) needs ``change_operator``.
    """
    _require_aware(now)
    rows = [
        {"org_code": p.org_code, "industry": p.industry, "base_url": p.base_url,
         "windows": json.dumps(p.window_strings), "calls_per_second": p.calls_per_second,
         "max_concurrency": p.max_concurrency, "options": _options(p), "updated_at": now,
         "retired_at": None}
        for p in insts.providers
    ]
    listed = [p.org_code for p in insts.providers]
    async with transaction(engine) as conn:
        old_op = await _stored_operator(conn)
        if old_op is not None and old_op != insts.operator_org_code and not change_operator:
            raise ConfigError(
                f"changes the operator org code from {old_op} to {insts.operator_org_code}, "
                "which changes every transaction id; if that is meant, load again with "
                "--change-operator-org-code", file=source, field=OPERATOR_KEY)
        missing = [c for c in await _active_codes(conn) if c not in listed]
        if missing and not retire_missing:
            raise ConfigError(
                f"no longer lists provider(s) {', '.join(missing)}, which the database "
                "would go on calling; add them back, or load with --retire-missing to "
                "retire them (never planned or called again)", file=source)
        await conn.execute(
            _upsert(conn, institutions, ["org_code"],
                    ["industry", "base_url", "windows", "calls_per_second", "max_concurrency",
                     "options", "updated_at", "retired_at"]),
            rows,
        )
        if missing:
            await conn.execute(update(institutions).where(
                institutions.c.org_code.in_(missing)).values(retired_at=now, updated_at=now))
        await conn.execute(_upsert(conn, settings, ["key"], ["value"]),
                           [{"key": OPERATOR_KEY, "value": insts.operator_org_code}])
        await mark_loaded(conn, "institutions", now)  # a plan made before is stale
    return len(rows)


def _stored_windows(code: str, text: str) -> tuple[Window, ...]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:  # files from before windows were stored as JSON
        raw = [w.strip() for w in text.split(",") if w.strip()]
    try:
        # Checked in full at load; the reader only needs them to be windows.
        return parse_windows(raw if isinstance(raw, list) else [raw], min_total_minutes=0)
    except WindowError as exc:
        raise ConfigError(f"institution {code}: {exc}; load the institutions file again",
                          field="windows") from None


async def read_providers(conn: AsyncConnection) -> list[Provider]:
    """The active (not retired) providers as last loaded, by org code: the one reader of
    the ``institutions`` table (the run, the planner)."""
    rows = (await conn.execute(
        select(institutions).where(institutions.c.retired_at.is_(None))
        .order_by(institutions.c.org_code))).mappings().all()
    providers = []
    for r in rows:
        code = r["org_code"].strip()
        try:
            opts = json.loads(r["options"] or "{}")
            if not isinstance(opts, dict):
                raise TypeError("options are not a JSON object")
            tuning = {k: opts.pop(k) for k in _TUNING if k in opts}
            providers.append(Provider(
                org_code=code, industry=r["industry"], base_url=r["base_url"],
                windows=_stored_windows(code, r["windows"]),
                calls_per_second=float(r["calls_per_second"]),
                max_concurrency=int(r["max_concurrency"]), extra=opts, **tuning,
            ))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"stored provider {code} is invalid: {exc}; "
                              "load the institutions file again") from None
    return providers


async def read_institutions(engine: AsyncEngine) -> Institutions:
    """The Institutions object as last loaded; ConfigError if none were loaded yet."""
    async with connect(engine) as conn:
        op = await _stored_operator(conn)
        providers = await read_providers(conn)
    if op is None or not providers:
        raise ConfigError("no institutions in the database; run "
                          "'mydata-batch load institutions FILE.toml' first")
    return Institutions(operator_org_code=op, providers=tuple(providers))


# --- consents ------------------------------------------------------------------------------

_STAGE_COLUMNS = ("line", "user_id", "org_code", "access_token", "refresh_token",
                  "consented_at", "last_scheduled_at", "due_week", "not_before")
_STAGE_PG = """
CREATE TEMP TABLE consents_stage (
    line INTEGER, user_id TEXT, org_code TEXT, access_token TEXT, refresh_token TEXT,
    consented_at TIMESTAMP, last_scheduled_at TIMESTAMP, due_week DATE, not_before TIMESTAMP
) ON COMMIT DROP"""
_STAGE_SQLITE = """
CREATE TEMP TABLE consents_stage (
    line INTEGER, user_id TEXT, org_code TEXT, access_token TEXT, refresh_token TEXT,
    consented_at TEXT, last_scheduled_at TEXT, due_week TEXT, not_before TEXT
)"""
_FIRST_DUPLICATE = """
SELECT user_id, org_code, MIN(line), MAX(line) FROM consents_stage
GROUP BY user_id, org_code HAVING COUNT(*) > 1 ORDER BY MAX(line) LIMIT 1"""
# New consents go in in the order the dispatcher claims them (a provider's, by due week, in
# the file's order): ids are given in that order and the table is written in it, so a claim's
# rows sit together on a few pages instead of one page each. Measured on 10,000,000 consents
# (tests/bench/test_claim_query.py): a 700-row claim on rows scattered in a mixed file's
# order wrote some 270 full-page images to the WAL (its first change to each page since the
# checkpoint), p50 15.5-16 ms at the producer's cadence; in this order (and the fillfactor
# of sql/010_claim_locality.sql) some 60, p50 11.5-14 ms (p99 17-21 ms, two runs).
# A re-load never moves a consent's schedule backwards: the batch may have fetched it since
# the file was written. A dead or revoked consent comes back only with a newer consent.
# ``WHERE true`` keeps SQLite from reading ON CONFLICT as a join clause.
_MERGE = """
INSERT INTO consents (user_id, org_code, access_token, refresh_token, consented_at,
                      last_scheduled_at, status, due_week, not_before, attempts,
                      unknown_attempts, updated_at)
SELECT user_id, org_code, access_token, refresh_token, {consented_at}, {last_scheduled_at},
       'active', due_week, {not_before}, 0, 0, :now
FROM consents_stage WHERE true
ORDER BY org_code, due_week, line
ON CONFLICT (user_id, org_code) DO UPDATE SET
    access_token = CASE WHEN consents.status = 'revoked'
                         AND excluded.consented_at <= consents.consented_at
                        THEN consents.access_token ELSE excluded.access_token END,
    refresh_token = CASE WHEN consents.status = 'revoked'
                          AND excluded.consented_at <= consents.consented_at
                         THEN consents.refresh_token
                         ELSE COALESCE(excluded.refresh_token, consents.refresh_token) END,
    status = CASE WHEN excluded.consented_at > consents.consented_at THEN 'active'
                  ELSE consents.status END,
    consented_at = excluded.consented_at,
    last_scheduled_at = CASE
        WHEN consents.last_scheduled_at IS NULL
          OR excluded.last_scheduled_at > consents.last_scheduled_at
        THEN excluded.last_scheduled_at ELSE consents.last_scheduled_at END,
    due_week = CASE WHEN excluded.due_week > consents.due_week
                    THEN excluded.due_week ELSE consents.due_week END,
    attempts = CASE WHEN excluded.due_week > consents.due_week
                    THEN 0 ELSE consents.attempts END,
    unknown_attempts = CASE WHEN excluded.due_week > consents.due_week
                            THEN 0 ELSE consents.unknown_attempts END,
    not_before = CASE WHEN excluded.not_before > consents.not_before
                      THEN excluded.not_before ELSE consents.not_before END,
    updated_at = excluded.updated_at"""

# PostgreSQL stages KST wall-clock TIMESTAMPs (asyncpg encodes naive datetimes about four
# times faster than aware ones) and converts them here; SQLite stages the final UTC text.
_FROM_KST = "timezone(INTERVAL '+09:00', {})"
_MERGE_PG = _MERGE.format(**{c: _FROM_KST.format(c) for c in
                             ("consented_at", "last_scheduled_at", "not_before")})
_MERGE_SQLITE = _MERGE.format(consented_at="consented_at",
                              last_scheduled_at="last_scheduled_at", not_before="not_before")

StageRow = tuple[Any, ...]
#: (org_code, user_id, access token, refresh token or None) -> the pair sealed
Sealer = Callable[[str, str, str, str | None], tuple[str, str | None]]


_UTC_OFFSET = timedelta(hours=9)


def _kst_wall(text: str) -> datetime:
    """An ISO 8601 timestamp as a naive KST wall-clock datetime. Raises ValueError.

    Naive values compare and convert several times faster than aware ones, which matters
    at a million rows; the database side turns them back into instants.
    """
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        return value
    if value.utcoffset() != _UTC_OFFSET:
        value = value.astimezone(KST)
    return value.replace(tzinfo=None)


def _sqlite_ts(kst_wall: datetime) -> str:
    """The text SQLAlchemy's SQLite DateTime writes for UTCDateTime: naive UTC, microseconds."""
    return (kst_wall - _UTC_OFFSET).isoformat(" ", "microseconds")


def _parse_consents(src: CsvInput, known: frozenset[str], now: datetime, *,
                    as_text: bool, seal: Sealer) -> Iterator[list[StageRow]]:
    """Validate rows and yield them in chunks, ready for the staging table, tokens sealed
    by ``seal`` (``TokenCipher.seal_pair``: each bound to its row's (org_code, user_id)
    and column).

    Timestamps are KST wall-clock (naive) here; the due week (``next_due_week``) is computed
    through a per-date cache of ``week_start`` on their KST dates.
    """
    now_kst = now.astimezone(KST).replace(tzinfo=None)
    has_refresh = src.width > len(CONSENT_COLUMNS)
    week_of: dict[date, date] = {}
    week_start_at: dict[date, datetime] = {}
    week = timedelta(days=7)
    chunk: list[StageRow] = []
    for line, row in src.rows():
        user_id, org, token, c_raw, l_raw = row[0], row[1], row[2], row[3], row[4]
        if not user_id.strip():
            raise src.error(line, "user_id", "is empty")
        if org not in known:
            why = "is empty" if not org else (
                f"{org!r} is not a known provider (load it with 'load institutions' first)")
            raise src.error(line, "org_code", why)
        if not token.strip():
            raise src.error(line, "access_token", "is empty")
        try:
            consented = _kst_wall(c_raw)
        except ValueError:
            raise src.error(line, "consented_at",
                            "is empty" if not c_raw else bad_timestamp(c_raw)) from None
        if consented > now_kst:
            raise src.error(line, "consented_at", f"{c_raw!r} is in the future")
        last: datetime | None = None
        if l_raw:
            try:
                last = _kst_wall(l_raw)
            except ValueError:
                raise src.error(line, "last_scheduled_at", bad_timestamp(l_raw)) from None
            if last < consented:
                raise src.error(line, "last_scheduled_at",
                                f"{l_raw!r} is before consented_at {c_raw!r}")
            if last > now_kst:
                raise src.error(line, "last_scheduled_at", f"{l_raw!r} is in the future")
        # next_due_week(last, consented), inlined: .date() of a KST wall clock is the KST date.
        day = (consented if last is None else last).date()
        due = week_of.get(day)
        if due is None:
            due = week_of[day] = week_start(day)
        if last is not None:
            due = due + week
        start = week_start_at.get(due)
        if start is None:
            start = week_start_at[due] = datetime.combine(due, time(0))
        not_before = consented if consented > start else start
        token, refresh = seal(org, user_id, token, row[5] if has_refresh and row[5] else None)
        if as_text:
            chunk.append((line, user_id, org, token, refresh, _sqlite_ts(consented),
                          None if last is None else _sqlite_ts(last), due.isoformat(),
                          _sqlite_ts(not_before)))
        else:
            chunk.append((line, user_id, org, token, refresh, consented, last, due,
                          not_before))
        if len(chunk) >= CHUNK_ROWS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def _stage(conn: AsyncConnection, chunks: Iterator[list[StageRow]]) -> int:
    """Create the staging table and fill it; returns the number of rows."""
    count = 0
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql(_STAGE_PG)
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        for chunk in chunks:
            await driver.copy_records_to_table(
                "consents_stage", records=chunk, columns=list(_STAGE_COLUMNS))
            count += len(chunk)
        return count
    await conn.exec_driver_sql("DROP TABLE IF EXISTS temp.consents_stage")
    await conn.exec_driver_sql(_STAGE_SQLITE)
    insert = f"INSERT INTO consents_stage VALUES ({','.join('?' * len(_STAGE_COLUMNS))})"
    for chunk in chunks:
        await conn.exec_driver_sql(insert, chunk)
        count += len(chunk)
    return count


async def _refuse_duplicates(conn: AsyncConnection, src: CsvInput) -> None:
    """Raise InputError at the first repeated (user_id, org_code) in the staging table."""
    dup = (await conn.exec_driver_sql(_FIRST_DUPLICATE)).first()
    if dup is not None:
        user, org, first, again = tuple(dup)
        raise src.error(again, "user_id", f"duplicate consent of user {user!r} at "
                                          f"{org.strip()} (first on line {first})")


async def load_consents(engine: AsyncEngine, path: str | Path, *, now: datetime,
                        cipher: TokenCipher, ignore_extra: bool = False,
                        progress: Progress | None = None) -> int:
    """Validate a consents CSV and upsert it on (user_id, org_code); returns the row count.

    Re-loading updates tokens and consent times; the weekly schedule only moves forward.
    Tokens are stored sealed with ``cipher``; if it cannot open the tokens already stored
    (a wrong key), TokenKeyError before anything is written.
    """
    _require_aware(now)
    with CsvInput(path, CONSENT_COLUMNS, CONSENT_OPTIONAL, ignore_extra=ignore_extra,
                  progress=progress) as src:
        async with transaction(engine) as conn:
            await check_stored_tokens(conn, cipher)
            known = await _org_codes(conn)
            sqlite_db = conn.dialect.name == "sqlite"
            # Parsing in a thread to overlap with the COPY was measured: no gain (GIL-bound).
            count = await _stage(conn, _parse_consents(src, known, now, as_text=sqlite_db,
                                                       seal=cipher.seal_pair))
            merge = text(_MERGE_SQLITE if sqlite_db else _MERGE_PG).bindparams(
                bindparam("now", type_=UTCDateTime))
            if sqlite_db:
                await _refuse_duplicates(conn, src)
                await conn.execute(merge, {"now": now})
                await conn.exec_driver_sql("DROP TABLE temp.consents_stage")
            else:
                # PostgreSQL refuses a merge that proposes one key twice (SQLSTATE 21000), so
                # the duplicate scan runs only when that happens.
                try:
                    async with conn.begin_nested():
                        await conn.execute(merge, {"now": now})
                except DBAPIError as exc:
                    if getattr(exc.orig, "sqlstate", None) != "21000":
                        raise
                    await _refuse_duplicates(conn, src)
                    raise
                # Fresh statistics for the dispatcher's first keyset scans.
                await conn.exec_driver_sql("ANALYZE consents")
            await mark_loaded(conn, "consents", now)  # a plan made before is stale
    return count


# --- usage history -------------------------------------------------------------------------

async def load_usage(engine: AsyncEngine, path: str | Path, *, now: datetime,
                     ignore_extra: bool = False, progress: Progress | None = None) -> int:
    """Validate a usage CSV (org_code,date,user_calls) and upsert it on (org_code, date).

    A row dated after ``now``'s KST date is refused: it is a typo or a clock gone wrong,
    and the planner would read it as what actually happened.
    """
    _require_aware(now)
    today = now.astimezone(KST).date()
    with CsvInput(path, USAGE_COLUMNS, ignore_extra=ignore_extra, progress=progress) as src:
        async with transaction(engine) as conn:
            known = await _org_codes(conn)
            seen: dict[tuple[str, date], int] = {}
            rows: list[dict[str, Any]] = []
            for line, row in src.rows():
                org, day_raw, calls_raw = row
                if org not in known:
                    raise src.error(line, "org_code", "is empty" if not org else (
                        f"{org!r} is not a known provider (load it with "
                        f"'load institutions' first)"))
                try:
                    day = parse_day(day_raw)
                except ValueError:
                    raise src.error(line, "date", f"{day_raw!r} is not a date like "
                                                  f"2026-11-29") from None
                if day > today:
                    raise src.error(line, "date", f"{day} is in the future (today is {today} "
                                                  "KST); usage rows record days gone by")
                try:
                    calls = parse_count(calls_raw)
                except ValueError:
                    raise src.error(line, "user_calls", f"{calls_raw!r} is not a "
                                                        f"non-negative whole number") from None
                first = seen.setdefault((org, day), line)
                if first != line:
                    raise src.error(line, "date", f"duplicate row for {org} on {day} "
                                                  f"(first on line {first})")
                rows.append({"org_code": org, "day": day, "user_calls": calls})
            stmt = _upsert(conn, usage_daily, ["org_code", "day"], ["user_calls"])
            for i in range(0, len(rows), CHUNK_ROWS):
                await conn.execute(stmt, rows[i:i + CHUNK_ROWS])
    return len(rows)


async def usage_history(engine: AsyncEngine, *, today: date, days: int
                        ) -> dict[str, tuple[int, int]]:
    """Per active provider: (days with a usage row, days from the first row to the last)
    among the ``days`` days before ``today``; (0, 0) for a provider with none."""
    ud = usage_daily.c
    async with connect(engine) as conn:
        codes = await _active_codes(conn)
        rows = (await conn.execute(
            select(ud.org_code, func.count(), func.min(ud.day), func.max(ud.day))
            .where(ud.day < today, ud.day >= today - timedelta(days=days))
            .group_by(ud.org_code))).all()
    found = {str(r[0]).strip(): (int(r[1]), (_as_date(r[3]) - _as_date(r[2])).days + 1)
             for r in rows}
    return {c: found.get(c, (0, 0)) for c in codes}


async def usage_days(engine: AsyncEngine, first: date, last: date
                     ) -> frozenset[tuple[str, date]]:
    """The (provider, day) pairs from ``first`` to ``last`` that have a usage row: the days
    whose user calls are actual, not forecast."""
    ud = usage_daily.c
    async with connect(engine) as conn:
        rows = await conn.execute(select(ud.org_code, ud.day).where(ud.day.between(first,
                                                                                    last)))
        return frozenset((str(r[0]).strip(), _as_date(r[1])) for r in rows)


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


__all__ = [
    "CONSENT_COLUMNS",
    "USAGE_COLUMNS",
    "load_consents",
    "load_institutions",
    "load_usage",
    "missing_providers",
    "read_institutions",
    "read_providers",
]
