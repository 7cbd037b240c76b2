"""The hot path's multi-row statements (batch/db/bulk.py), on both backends."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, insert, select, text, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.db import bulk, schema
from batch.db.engine import transaction

NOW = datetime(2026, 11, 30, 1, 0, 30, 123456, tzinfo=KST)
WEEK = date(2026, 11, 29)


async def _consents(engine: AsyncEngine, n: int, *, owner: str | None) -> list[int]:
    async with transaction(engine) as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code="BANK000001", industry="bank", base_url="http://127.0.0.1:9",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=2, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"id": i, "user_id": f"u{i}", "org_code": "BANK000001", "access_token": "sealed",
             "consented_at": NOW, "due_week": WEEK, "not_before": NOW, "updated_at": NOW,
             "lease_owner": owner, "lease_until": NOW + timedelta(minutes=10)}
            for i in range(1, n + 1)])
    return list(range(1, n + 1))


def test_every_consent_and_outcome_column_has_a_postgresql_type() -> None:
    for table in (schema.consents, schema.call_outcomes):
        for col in table.c:
            assert bulk.pg_type(table, col.name)


async def test_an_update_changes_only_the_rows_the_worker_still_leases(
        engine: AsyncEngine) -> None:
    ids = await _consents(engine, 4, owner="w1")
    async with transaction(engine) as conn:
        await conn.execute(update(schema.consents).where(schema.consents.c.id == 2)
                           .values(lease_owner="w2"))
        changed = await conn.run_sync(
            bulk.update_held, ids, [{"attempts": i, "not_before": NOW + timedelta(hours=i),
                         "lease_owner": None} for i in ids], worker="w1")
    assert changed == {1, 3, 4}
    async with engine.connect() as conn:
        rows = {r.id: r for r in (await conn.execute(select(schema.consents))).all()}
    assert [rows[i].attempts for i in ids] == [1, 0, 3, 4]
    assert rows[3].not_before == NOW + timedelta(hours=3)
    assert rows[2].lease_owner == "w2" and rows[1].lease_owner is None


async def test_an_update_prepared_before_its_transaction_checks_the_lease_as_it_runs(
        engine: AsyncEngine) -> None:
    """The outcome writer makes its statements before the transaction opens; a lease lost
    in between still keeps the row out of the write."""
    ids = await _consents(engine, 3, owner="w1")
    prepared = bulk.prepare_update(engine.dialect, ids, [{"attempts": 7} for _ in ids],
                                   worker="w1")
    async with transaction(engine) as conn:
        await conn.execute(update(schema.consents).where(schema.consents.c.id == 2)
                           .values(lease_owner="w2"))
    async with transaction(engine) as conn:
        assert await conn.run_sync(prepared.run) == {1, 3}
    async with engine.connect() as conn:
        got = (await conn.execute(select(schema.consents.c.attempts)
                                  .order_by(schema.consents.c.id))).scalars().all()
    assert got == [7, 0, 7]


async def test_a_write_prepared_for_one_database_is_refused_on_another(
        engine: AsyncEngine) -> None:
    other = sqlite.dialect() if engine.dialect.name == "postgresql" else pg_asyncpg.dialect()
    rows = [{"run_id": "r1", "consent_id": 1, "org_code": "BANK000001", "day": NOW.date(),
             "tran_id": None, "kind": "success", "action": "done", "rsp_code": "00000",
             "calls": 2, "elapsed_ms": 5, "at": NOW}]
    for prepared in (bulk.prepare_outcomes(other, rows),
                     bulk.prepare_update(other, [1], [{"attempts": 1}], worker="w1")):
        async with transaction(engine) as conn:
            with pytest.raises(ValueError, match=f"prepared for {other.name}"):
                await conn.run_sync(prepared.run)


async def test_a_time_is_stored_in_the_form_sqlalchemy_stores(engine: AsyncEngine) -> None:
    """SQLite compares times as text: the bulk form must be byte for byte SQLAlchemy's."""
    await _consents(engine, 2, owner="w1")
    at = datetime(2026, 12, 1, 3, 4, 5, tzinfo=UTC)
    async with transaction(engine) as conn:
        await conn.execute(update(schema.consents).where(schema.consents.c.id == 1)
                           .values(not_before=at))
        await conn.run_sync(bulk.update_held, [2], [{"not_before": at}], worker="w1")
        raw = (await conn.execute(text(
            "SELECT CAST(not_before AS TEXT) FROM consents ORDER BY id"))).scalars().all()
    assert raw[0] == raw[1]


async def test_set_where_held_keeps_the_first_start_mark(engine: AsyncEngine) -> None:
    ids = await _consents(engine, 3, owner="w1")
    later = NOW + timedelta(seconds=5)
    async with transaction(engine) as conn:
        assert sorted(await conn.run_sync(bulk.set_where_held, [1, 2], worker="w1",
                                          values={"started_at": NOW},
                                          only_unset="started_at")) == [1, 2]
        assert sorted(await conn.run_sync(bulk.set_where_held, ids, worker="w1",
                                          values={"started_at": later},
                                          only_unset="started_at")) == ids
        assert await conn.run_sync(bulk.set_where_held, ids, worker="nobody",
                                   values={"lease_owner": None}) == []
    async with engine.connect() as conn:
        marks = (await conn.execute(select(schema.consents.c.started_at)
                                    .order_by(schema.consents.c.id))).scalars().all()
    assert marks == [NOW, NOW, later]


@pytest.mark.parametrize("n", [1, 1200])
async def test_held_by_answers_for_more_ids_than_sqlite_binds_at_once(
        engine: AsyncEngine, n: int) -> None:
    ids = await _consents(engine, n, owner="w1")
    async with transaction(engine) as conn:
        assert await conn.run_sync(bulk.held_by, ids, worker="w1", lock=True) == set(ids)
        assert await conn.run_sync(bulk.held_by, ids, worker="w2") == set()


def test_a_column_with_an_earlier_arrays_values_reads_that_array() -> None:
    """A refresh's updated_at and last_scheduled_at are both its time: one array, not two;
    equal values of another type (bigint ids, integer calls) still travel apart."""
    times = [{"updated_at": NOW + timedelta(seconds=i), "last_scheduled_at":
              NOW + timedelta(seconds=i), "not_before": NOW + timedelta(seconds=i % 2)}
             for i in range(3)]
    split = bulk._Columns.of(schema.consents, times,
                             ("updated_at", "last_scheduled_at", "not_before"))
    assert split.arrays == ("updated_at", "not_before")
    assert split.aliases == (("last_scheduled_at", "updated_at"),)
    assert split.sql_parts(schema.consents, 2)[1]["last_scheduled_at"] == "u.updated_at"
    rows = [{"consent_id": i, "calls": i} for i in (1, 2, 3)]
    split = bulk._Columns.of(schema.call_outcomes, rows, ("consent_id", "calls"))
    assert split.arrays == ("consent_id", "calls") and split.aliases == ()


async def _updated(engine: AsyncEngine, ids: list[int],
                   values: list[dict[str, object]]) -> list[dict[str, object]]:
    """``update_held`` of ``values`` (worker w1 holds every id), then those columns read
    back in id order."""
    async with transaction(engine) as conn:
        assert await conn.run_sync(bulk.update_held, ids, values, worker="w1") == set(ids)
    async with engine.connect() as conn:
        cols = [schema.consents.c[k] for k in values[0]]
        return [dict(r._mapping) for r in (await conn.execute(
            select(*cols).order_by(schema.consents.c.id))).all()]


@pytest.mark.parametrize("same", [True, False])
async def test_columns_sharing_an_array_are_each_written(engine: AsyncEngine,
                                                         same: bool) -> None:
    ids = await _consents(engine, 3, owner="w1")
    values = [{"updated_at": NOW + timedelta(seconds=i),
               "last_scheduled_at": NOW + timedelta(seconds=i if same or i < 3 else 99),
               "attempts": i, "unknown_attempts": i, "lease_owner": None} for i in ids]
    assert await _updated(engine, ids, values) == values


async def test_values_every_row_shares_go_once_and_are_stored_as_sqlalchemy_stores_them(
    engine: AsyncEngine,
) -> None:
    """A shared time, date and NULL travel once (SQLite: one parameter each, the JSON rows
    carry only the id and what varies) and read back as the ORM wrote them."""
    ids = await _consents(engine, 3, owner="w1")
    later = NOW + timedelta(days=1, microseconds=1)
    values = [{"updated_at": NOW + timedelta(seconds=i), "not_before": later,
               "due_week": WEEK + timedelta(days=7), "last_error": None,
               "week_result": "done"} for i in ids]
    sent: list[tuple[str, object]] = []

    def _sent(_c: object, _cur: object, statement: str, params: object, *_: object) -> None:
        sent.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", _sent)
    try:
        got = await _updated(engine, ids, values)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", _sent)
    assert got == values
    if engine.dialect.name == "sqlite":
        (params,) = [p for st, p in sent if st.startswith("UPDATE")]
        rows = next(json.loads(p) for p in params if isinstance(p, str) and p[:1] == "[")
        assert [len(r) for r in rows] == [2, 2, 2]  # the id and updated_at


async def _inserted(engine: AsyncEngine,
                    rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """``insert_outcomes`` of ``rows``, then every outcome row read back in consent order
    (without its id, the CHAR(n) columns' padding taken off)."""
    async with transaction(engine) as conn:
        await conn.run_sync(bulk.insert_outcomes, rows)
    async with engine.connect() as conn:
        got = [dict(r._mapping) for r in (await conn.execute(
            select(schema.call_outcomes).order_by(schema.call_outcomes.c.consent_id))).all()]
    for r in got:
        del r["id"]
        r["org_code"] = r["org_code"].strip()
        if r["tran_id"] is not None:
            r["tran_id"] = r["tran_id"].rstrip(" ")
    return got


async def test_varying_values_of_every_kind_read_back_exactly(engine: AsyncEngine) -> None:
    """What varies travels as rows of JSON (times as microseconds since the epoch on
    PostgreSQL): times in any zone, from year 1 to 9999, before the epoch and to the
    microsecond, dates, NULLs among values, and text that needs escaping all come back as
    they went."""
    odd = timezone(timedelta(hours=-9, minutes=-30))
    times = [datetime(1, 1, 1, 9, 30, tzinfo=KST),
             datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
             datetime(1970, 1, 1, tzinfo=odd), NOW + timedelta(microseconds=999_999),
             datetime(9999, 12, 31, 13, 59, 59, 999_999, tzinfo=odd), None]
    errors = ['say "hi"', "back\\slash, comma", "줄\n바꿈 \u00e9 \t", None, "", "{}"]
    ids = await _consents(engine, len(times), owner="w1")
    values = [{"not_before": t, "last_error": e, "counters_week": None if k % 2 else
               WEEK + timedelta(days=7 * k), "attempts": k, "lease_owner": None}
              for k, (t, e) in enumerate(zip(times, errors, strict=True))]
    values[-1]["not_before"] = NOW  # the column is NOT NULL
    assert await _updated(engine, ids, values) == values
    rows = [{"run_id": "r1", "consent_id": i, "org_code": "BANK000001", "day": NOW.date(),
             "tran_id": e, "kind": "success", "action": "done", "rsp_code": None,
             "calls": 2, "elapsed_ms": i, "at": t or NOW} for i, t, e in zip(
                 ids, times, errors, strict=True)]
    assert await _inserted(engine, rows) == rows


@pytest.mark.parametrize("n", [1, 3])
async def test_outcome_rows_alike_or_not_are_all_written(engine: AsyncEngine, n: int) -> None:
    """Columns with one value for every row go as one parameter, the rest as arrays."""
    rows = [{"run_id": "r1", "consent_id": 10 + i, "org_code": "BANK000001",
             "day": NOW.date(), "tran_id": None if i else "OPERATOR01M00000000000001",
             "kind": "success", "action": "done", "rsp_code": "00000", "calls": 2,
             "elapsed_ms": 5 * i, "at": NOW + timedelta(seconds=i)} for i in range(n)]
    assert await _inserted(engine, rows) == rows


_ZONES = [UTC, KST, timezone(timedelta(hours=-9, minutes=-30))]


@given(st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9999, 12, 30),
                    timezones=st.sampled_from(_ZONES)))
def test_the_sqlite_time_text_is_the_one_sqlalchemy_stores(value: datetime) -> None:
    dialect = sqlite.dialect()
    col = schema.consents.c.updated_at.type
    theirs = col.dialect_impl(dialect).bind_processor(dialect)
    procs = bulk._sqlite_processors(dialect, schema.consents, ("updated_at", "due_week"))
    assert procs[0](value) == theirs(value)
    day = value.date()
    date_proc = schema.consents.c.due_week.type.dialect_impl(dialect).bind_processor(dialect)
    assert bulk._processed({"updated_at": value, "due_week": day},
                           ("updated_at", "due_week"), procs) == [theirs(value),
                                                                  date_proc(day)]


def test_the_sqlite_time_text_refuses_a_naive_time() -> None:
    procs = bulk._sqlite_processors(sqlite.dialect(), schema.consents, ("updated_at",))
    with pytest.raises(ValueError, match="naive"):
        procs[0](datetime(2026, 11, 30, 1, 0))


@given(st.lists(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                             timezones=st.sampled_from(_ZONES)), min_size=1, max_size=20))
def test_a_varying_time_is_made_by_sqlite_into_the_text_sqlalchemy_stores(
        values: list[datetime]) -> None:
    """A time that varies travels as a number and SQLite makes the text (SQLite compares
    times as text: it must be byte for byte SQLAlchemy's), from year 1 to 9999, in any
    zone, before the epoch too."""
    dialect = sqlite.dialect()
    theirs = schema.consents.c.updated_at.type.dialect_impl(dialect).bind_processor(dialect)
    rows = json.dumps([[bulk._sqlite_us(v)] for v in values])
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        made = [r[0] for r in db.execute(
            f"SELECT {bulk._sqlite_time_sql('t')} FROM (SELECT json_extract(value, '$[0]') "
            "AS t FROM json_each(?))", (rows,))]
    assert made == [theirs(v) for v in values]


def test_a_varying_time_that_is_null_stays_null() -> None:
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        (made,) = db.execute(f"SELECT {bulk._sqlite_time_sql('t')} FROM (SELECT NULL AS t)")
    assert made == (None,)
    with pytest.raises(ValueError, match="naive"):
        bulk._sqlite_us(datetime(2026, 11, 30, 1, 0))


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                    timezones=st.sampled_from((*_ZONES, ZoneInfo("America/New_York"),
                                               ZoneInfo("Asia/Seoul")))))
def test_a_time_in_microseconds_is_exact_in_every_zone(value: datetime) -> None:
    """_epoch_us and _sqlite_us subtract a base time of the value's own fixed-offset zone
    (no offset lookups): the same microseconds as against UTC, west of UTC and in year 1
    too, and a zone with daylight saving time against the UTC base."""
    us = timedelta(microseconds=1)
    assert bulk._epoch_us(value) == (value - datetime(1970, 1, 1, tzinfo=UTC)) // us
    assert bulk._sqlite_us(value) == (value - datetime(1, 1, 1, tzinfo=UTC)) // us
