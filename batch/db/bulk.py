"""The hot path's multi-row statements: one statement per shape of change, never one per row.

A flush of the outcome writer turns hundreds of transitions into a handful of statements,
and a claim, a start mark or a lease renewal into one. What each row gets is still said
once (``batch.db.work.consent_changes`` and the row builders); this module only moves those
values to the database in bulk, and skips SQLAlchemy's per-row parameter processing, which
was most of the client's cost of a write (tests/bench/profile_dispatch.py):

- on both, a value every row shares is one parameter and the rows carry only what varies,
  as one JSON text: one prepared statement per shape, whatever the number of rows (an
  ``IN`` list of n parameters is a new statement for every n); id lists alone go as
  ``= ANY($1)`` / ``json_each``;
- PostgreSQL: ``UPDATE ... FROM (SELECT ... FROM jsonb_array_elements($1))`` /
  ``INSERT ... SELECT``, times as whole microseconds since the epoch (exact, and no zone
  to format). It replaced one array per column: asyncpg encodes an array element by
  element and checks each against ``collections.abc`` in Python, and 300 outcome rows'
  four arrays cost it 1.2 ms of the loop's step on the slower test machine; the JSON
  text, built by the C encoder, took the insert from 2.3 to 1.6 ms of CPU and the
  update from 2.3 to 1.9 (medians of 70, SQLAlchemy's own cost included);
- SQLite: ``json_each``, the values first put in the form SQLAlchemy would store (each
  column type's bind processor; a time that varies travels as a number the statement
  makes into that text), and every statement answers in one row
  (``json_group_array``). Sending only what varies took a flush of 300 refreshes done
  from 24 and 20 ms of CPU to 12 and 14 ms (two alternated rounds, 40 flushes each):
  ``json_extract`` parses a row's text again for each field. Times as numbers (2026-12-05)
  took the update's and the insert's making from 1.6 to 0.8 ms each (300 refreshes done,
  medians of 60), and the update is now made before the transaction as on PostgreSQL:
  the loop's CPU for a whole 300-refresh flush fell from 7.2 and 5.2 ms to 5.6 and 3.7
  (two alternated rounds, medians of 40). SQLite runs in a thread of its own
  (:func:`batch.db.engine.run_transaction`), which takes the GIL back after each row it
  steps; against a busy event loop each of those waits up to the switch interval (5 ms):
  a 700-row write row by row (``executemany``) took a minute there, as one statement 0.1 s.

The functions here are synchronous, on a ``Connection``: the store runs each transaction
whole through :func:`batch.db.engine.run_transaction` (in SQLite's thread, or on the async
connection through ``run_sync``). Every consent update is guarded by the lease
(``lease_owner = worker``) and says which rows it changed, so a late write from a worker
whose lease expired changes nothing. A flush makes its statements before its transaction
opens (:class:`Prepared`), off the SQLite turn: the transaction only sends them (the lease
is still checked as the statement runs).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from typing import Any

from sqlalchemy import BigInteger, Boolean, Date, Float, Integer, SmallInteger, String, Text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.schema import Table

from batch.db.schema import UTCDateTime, call_outcomes, consents

#: PostgreSQL's type of each SQLAlchemy column type used on the hot path
_PG_TYPES: tuple[tuple[type, str], ...] = (
    (UTCDateTime, "timestamptz"), (SmallInteger, "smallint"), (BigInteger, "bigint"),
    (Integer, "integer"), (Date, "date"), (Float, "double precision"),
    (Boolean, "boolean"), (String, "text"), (Text, "text"),
)


def pg_type(table: Table, column: str) -> str:
    """The PostgreSQL type name of ``table.column`` that a value is cast to on its way in
    (text for CHAR/VARCHAR: the assignment casts it)."""
    t = table.c[column].type
    for cls, name in _PG_TYPES:
        if isinstance(t, cls):
            return name
    # with_variant types (BigId) report their base type through .impl
    impl = getattr(t, "impl", None)
    if impl is not None:
        for cls, name in _PG_TYPES:
            if isinstance(impl, cls):
                return name
    raise TypeError(f"no PostgreSQL type known for {table.name}.{column} ({t!r})")


def is_postgresql(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


# -- PostgreSQL -----------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _in_zone(base: datetime, tz: tzinfo, cache: dict[tzinfo, datetime]) -> datetime:
    """``base`` (UTC) as a time of the fixed-offset zone ``tz``, else ``base`` itself:
    between two times of one ``tzinfo`` object a subtraction skips both offsets' lookups
    (447 -> 191 ns), exact only for a fixed offset (a zone with daylight saving time
    subtracts wall clocks so: those keep ``base``)."""
    got = cache.get(tz)
    if got is None:
        got = base
        if type(tz) is timezone:
            with contextlib.suppress(OverflowError):  # year 1 in a zone west of UTC
                got = base.astimezone(tz)
        cache[tz] = got
    return got


_EPOCHS: dict[tzinfo, datetime] = {}


def _epoch_us(value: datetime) -> int:
    """An aware time as whole microseconds since the epoch (exact, whatever its zone)."""
    tz = value.tzinfo
    if tz is None:
        raise ValueError("naive datetime given to the database; use aware datetimes")
    return (value - _in_zone(_EPOCH, tz, _EPOCHS)) // _MICROSECOND


#: a value's form in a PostgreSQL JSON row, by column type (others go as they are)
_PG_JSON: dict[str, Callable[[Any], Any]] = {"timestamptz": _epoch_us,
                                             "date": date.isoformat}


def _pg_field(kind: str, k: int) -> str:
    """Field ``k`` of a JSON row ``e`` as a value of type ``kind``: a time travels as
    microseconds since the epoch, added back as whole seconds and microseconds (each
    product exact in the double precision interval arithmetic uses)."""
    v = f"(e->>{k})"
    if kind == "timestamptz":
        return (f"TIMESTAMPTZ 'epoch' + {v}::bigint / 1000000 * INTERVAL '1 second' "
                f"+ {v}::bigint % 1000000 * INTERVAL '1 microsecond'")
    return f"{v}::{kind}"


@dataclass(frozen=True, slots=True)
class _Columns:
    """A batch's columns for one statement: those that vary travel in the rows (each in
    ``arrays``' order), those with one value for every row as a single parameter each (a
    flush's rows mostly share them: the week, the result, the cleared lease), and a column
    whose values are those of an earlier one (a refresh's ``updated_at`` and
    ``last_scheduled_at`` are both its time) reads that one's field (``aliases``)."""

    arrays: tuple[str, ...]
    scalars: tuple[str, ...]
    params: tuple[Any, ...]  # the arrays, then the scalars
    aliases: tuple[tuple[str, str], ...] = ()  # (column, the array column it reads)

    @classmethod
    def of(cls, table: Table, rows: Sequence[dict[str, Any]], cols: Sequence[str],
           always: str | None = None) -> _Columns:
        """The columns ``cols`` of ``rows`` for a statement on ``table``. ``always``: a
        column sent in the rows whatever its values (so that every row has a field)."""
        return cls.of_columns(table, cols, [[r[c] for r in rows] for c in cols], always)

    @classmethod
    def of_columns(cls, table: Table, cols: Sequence[str], columns: Sequence[list[Any]],
                   always: str | None = None) -> _Columns:
        """:meth:`of` for rows given as their columns (``columns[k]``: column ``cols[k]``'s
        values, a list each, every one as long)."""
        arrays: list[str] = []
        scalars: list[str] = []
        aliases: list[tuple[str, str]] = []
        vary: list[list[Any]] = []
        same: list[Any] = []
        for c, column in zip(cols, columns, strict=True):
            first = column[0]
            # count() compares in C; a column's values are of one type or None, and None,
            # a date and a datetime never compare equal to each other
            if c != always and column.count(first) == len(column):
                scalars.append(c)
                same.append(first)
                continue
            for name, values in zip(arrays, vary, strict=True):
                # of the same type too: a field is cast to its own column's type
                if column == values and pg_type(table, c) == pg_type(table, name):
                    aliases.append((c, name))
                    break
            else:
                arrays.append(c)
                vary.append(column)
        return cls(tuple(arrays), tuple(scalars), (*vary, *same), tuple(aliases))

    def sql_parts(self, table: Table, first: int, *, skip: int = 0
                  ) -> tuple[str, dict[str, str]]:
        """The JSON row's fields as columns (``, <expr> AS <column>`` each, for a sub-select
        over ``jsonb_array_elements(...) AS e``, after ``skip`` leading fields), and each
        column's expression (``u.<column>``, or parameter ``$first`` on for a shared
        value)."""
        fields = "".join(f", {_pg_field(pg_type(table, c), k + skip)} AS {c}"
                         for k, c in enumerate(self.arrays))
        expr = {c: f"u.{c}" for c in self.arrays}
        for n, c in enumerate(self.scalars, first):
            expr[c] = f"${n}::{pg_type(table, c)}"
        for c, source in self.aliases:
            expr[c] = f"u.{source}"
        return fields, expr

    def pg_rows(self, table: Table, first: Sequence[Any] | None = None) -> str:
        """The JSON text of the rows: ``first`` (a field put before the others: the id),
        then each varying column's value in the form :func:`_pg_field` reads."""
        columns: list[Sequence[Any]] = [] if first is None else [first]
        for c, values in zip(self.arrays, self.params, strict=False):
            enc = _PG_JSON.get(pg_type(table, c))
            columns.append(values if enc is None else
                           [None if v is None else enc(v) for v in values])
        return json.dumps(list(zip(*columns, strict=True)), separators=(",", ":"),
                          allow_nan=False)

    @property
    def shape(self) -> tuple[object, ...]:
        """What the statement's text depends on (its cache key)."""
        return (self.arrays, self.aliases)


_pg_statements: dict[tuple[object, ...], str] = {}

#: a statement's ids (``WITH w AS (... RETURNING id)``) as one array in one row: a row each
#: went through the driver and SQLAlchemy's result one by one (800 ids: 380 -> 130 us of
#: CPU, most of it the server's round trip)
_PG_IDS_OF_W = "SELECT array_agg(id) FROM w"


def _pg_update_sql(cols: tuple[str, ...], split: _Columns) -> str:
    key = ("update", cols, split.shape)
    sql = _pg_statements.get(key)
    if sql is None:
        fields, expr = split.sql_parts(consents, 2, skip=1)
        n = 2 + len(split.scalars)
        sets = ", ".join(f"{c} = {expr[c]}" for c in cols)
        sql = (f"WITH w AS (UPDATE consents AS c SET {sets} "
               f"FROM (SELECT (e->>0)::bigint AS id{fields} "
               "FROM jsonb_array_elements($1::jsonb) AS e) AS u "
               f"WHERE c.id = u.id AND c.lease_owner = ${n} "
               f"RETURNING c.id) {_PG_IDS_OF_W}")
        _pg_statements[key] = sql
    return sql


@dataclass(frozen=True, slots=True)
class Prepared:
    """A write made ready before its transaction opens (:func:`prepare_update`,
    :func:`prepare_outcomes`), so that the transaction only sends it: the statement and
    every parameter. SQLite's update answers no rows in one
    statement (a RETURNING row each: the driver's thread takes the GIL back for every
    one), so it first reads which of its consents are still leased (``held``, one row),
    then sends the statement, made for every row before the transaction and guarded by the
    lease as it runs: the rows it changes are those."""

    dialect: str
    sql: str | None
    params: tuple[Any, ...]
    #: SQLite's update: the ids and the worker whose lease is read first
    held: tuple[Sequence[int], str] | None = None

    def run(self, conn: Connection) -> set[int]:
        """Send it on ``conn`` (of the dialect it was made for); an update returns the ids
        it changed, an insert nothing."""
        if conn.dialect.name != self.dialect:
            raise ValueError(f"a write prepared for {self.dialect} run on {conn.dialect.name}")
        if self.sql is None:
            return set()
        if self.held is not None:
            ids, worker = self.held
            leased = held_by(conn, ids, worker=worker)
            if leased:
                conn.exec_driver_sql(self.sql, self.params)
            return leased
        res = conn.exec_driver_sql(self.sql, self.params)
        if res.returns_rows:
            return set(res.scalar_one() or ())  # the ids changed, one array (_PG_IDS_OF_W)
        return set()


def prepare_update(dialect: Dialect, ids: Sequence[int], values: Sequence[dict[str, Any]],
                   *, worker: str) -> Prepared:
    """:func:`update_held`, made ready (see :class:`Prepared`)."""
    if not ids:
        return Prepared(dialect.name, None, ())
    cols = tuple(values[0])
    return prepare_update_columns(dialect, ids, cols, [[v[c] for v in values] for c in cols],
                                  worker=worker)


def prepare_update_columns(dialect: Dialect, ids: Sequence[int], cols: tuple[str, ...],
                           columns: Sequence[list[Any]], *, worker: str) -> Prepared:
    """:func:`prepare_update` of values given as their columns (``columns[k]``: the value of
    ``cols[k]`` for each of ``ids``): what the outcome writer makes, without a dict a row."""
    if not ids:
        return Prepared(dialect.name, None, ())
    split = _Columns.of_columns(consents, cols, columns)
    if dialect.name == "postgresql":
        return Prepared(dialect.name, _pg_update_sql(cols, split),
                        (split.pg_rows(consents, ids), *split.params[len(split.arrays):],
                         worker))
    parts, params = _sqlite_unnest(dialect, consents, split, cols, ids)
    sets = ", ".join(f"{c} = {e}" for c, e in zip(cols, parts.select, strict=True))
    return Prepared(dialect.name,
                    f"UPDATE consents SET {sets} FROM (SELECT json_extract(value, '$[0]') AS id"
                    f"{parts.fields} FROM json_each(?)) AS u "
                    "WHERE consents.id = u.id AND consents.lease_owner = ?",
                    (*params, worker), held=(ids, worker))


def update_held(conn: Connection, ids: Sequence[int],
                      values: Sequence[dict[str, Any]], *, worker: str) -> set[int]:
    """Set each consent's ``values`` (all of one shape: the same columns) where ``worker``
    still holds its lease; returns the ids changed."""
    return prepare_update(conn.dialect, ids, values, worker=worker).run(conn)


def held_by(conn: Connection, ids: Sequence[int], *, worker: str,
                  lock: bool = False) -> set[int]:
    """Which of ``ids`` are leased by ``worker`` now (``lock``: PostgreSQL locks them)."""
    if not ids:
        return set()
    if is_postgresql(conn):
        res = conn.exec_driver_sql(
            "WITH w AS (SELECT id FROM consents WHERE id = ANY($1::bigint[]) "
            "AND lease_owner = $2" + (" FOR UPDATE" if lock else "") + f") {_PG_IDS_OF_W}",
            (list(ids), worker))
        return set(res.scalar_one() or ())
    res = conn.exec_driver_sql(
        "SELECT json_group_array(id) FROM consents "
        "WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?",
        (_json(list(ids)), worker))
    return set(json.loads(res.scalar_one()))


def set_where_held(conn: Connection, ids: Sequence[int], *, worker: str,
                         values: dict[str, Any], only_unset: str | None = None) -> list[int]:
    """Set the same ``values`` on every consent of ``ids`` leased by ``worker``; returns the
    ids it matched. ``only_unset``: a column set only where it is still NULL (the start
    mark keeps its first time), the row still counted as matched."""
    if not ids:
        return []
    cols = tuple(values)
    if is_postgresql(conn):
        sets = ", ".join(
            f"{c} = coalesce({c}, ${i + 3}::{pg_type(consents, c)})" if c == only_unset
            else f"{c} = ${i + 3}::{pg_type(consents, c)}" for i, c in enumerate(cols))
        res = conn.exec_driver_sql(
            f"WITH w AS (UPDATE consents SET {sets} WHERE id = ANY($1::bigint[]) "
            f"AND lease_owner = $2 RETURNING id) {_PG_IDS_OF_W}",
            (list(ids), worker, *(values[c] for c in cols)))
        return list(res.scalar_one() or ())
    held = held_by(conn, ids, worker=worker)
    if held:
        procs = _sqlite_processors(conn.dialect, consents, cols)
        sets = ", ".join(f"{c} = coalesce({c}, ?)" if c == only_unset else f"{c} = ?"
                         for c in cols)
        conn.exec_driver_sql(
            f"UPDATE consents SET {sets} "
            "WHERE id IN (SELECT value FROM json_each(?)) AND lease_owner = ?",
            (*_processed(values, cols, procs), _json(sorted(held)), worker))
    return [i for i in ids if i in held]


#: the ``call_outcomes`` columns a refresh's row has, in the order its values come
#: (``batch.db.work.outcome_values``)
OUTCOME_COLS = ("run_id", "consent_id", "org_code", "day", "tran_id", "kind", "action",
                "rsp_code", "calls", "elapsed_ms", "at")


def prepare_outcomes(dialect: Dialect, rows: Sequence[dict[str, Any]]) -> Prepared:
    """:func:`insert_outcomes`, made ready (see :class:`Prepared`)."""
    if not rows:
        return Prepared(dialect.name, None, ())
    return prepare_outcomes_columns(dialect, [[r[c] for r in rows] for c in OUTCOME_COLS])


def prepare_outcomes_columns(dialect: Dialect, columns: Sequence[list[Any]]) -> Prepared:
    """:func:`prepare_outcomes` of rows given as their columns, in ``call_outcomes``'
    column order (``OUTCOME_COLS``; none: no row)."""
    if not columns or not columns[0]:
        return Prepared(dialect.name, None, ())
    cols = OUTCOME_COLS
    names = ", ".join(cols)
    split = _Columns.of_columns(call_outcomes, cols, columns, always="consent_id")
    if dialect.name == "postgresql":
        key = ("outcomes", split.shape)
        sql = _pg_statements.get(key)
        if sql is None:
            fields, expr = split.sql_parts(call_outcomes, 2)
            sql = (f"INSERT INTO call_outcomes ({names}) "
                   f"SELECT {', '.join(expr[c] for c in cols)} "
                   f"FROM (SELECT {fields[2:]} "
                   "FROM jsonb_array_elements($1::jsonb) AS e) AS u")
            _pg_statements[key] = sql
        return Prepared(dialect.name, sql, (split.pg_rows(call_outcomes),
                                            *split.params[len(split.arrays):]))
    parts, params = _sqlite_unnest(dialect, call_outcomes, split, cols)
    return Prepared(dialect.name,
                    f"INSERT INTO call_outcomes ({names}) SELECT {', '.join(parts.select)} "
                    f"FROM (SELECT {parts.fields[2:]} FROM json_each(?)) AS u", tuple(params))


def insert_outcomes(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """The ``call_outcomes`` rows, in one statement."""
    prepare_outcomes(conn.dialect, rows).run(conn)


# -- SQLite ---------------------------------------------------------------------------------

Processor = Callable[[Any], Any] | None
_sqlite_procs: dict[tuple[str, tuple[str, ...]], tuple[Processor, ...]] = {}


def _sqlite_utc(value: datetime) -> str:
    """An aware datetime as SQLAlchemy stores a UTCDateTime on SQLite (naive UTC text,
    always with six digits of microseconds), in one pass of C calls: UTCDateTime's
    processor then SQLite DATETIME's ``%`` formatting took 2.3 us a value, this 1.4 us,
    and a flush formats three or four per refresh (tests/db/test_bulk.py pins that both
    give the same text)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the database; use aware datetimes")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _sqlite_processors(dialect: Dialect, table: Table,
                       cols: tuple[str, ...]) -> tuple[Processor, ...]:
    """Each column type's bind processor on this dialect: the stored form of a value
    (UTCDateTime: naive UTC text that sorts as time does), exactly as SQLAlchemy stores it."""
    key = (table.name, cols)
    procs = _sqlite_procs.get(key)
    if procs is None:
        procs = tuple(_sqlite_utc if isinstance(table.c[c].type, UTCDateTime)
                      else table.c[c].type.dialect_impl(dialect).bind_processor(dialect)
                      for c in cols)
        _sqlite_procs[key] = procs
    return procs


@dataclass(frozen=True, slots=True)
class _SqliteParts:
    """A split batch's SQL on SQLite: ``fields``, the JSON row's fields named as columns
    (``, json_extract(value, '$[k]') AS <column>`` each, for a sub-select over
    ``json_each``), and ``select``, each column's expression (``u.<column>``, or ``?``
    for a value every row shares)."""

    fields: str
    select: tuple[str, ...]


#: a time in a SQLite JSON row: whole microseconds since 0001-01-01 UTC (never negative,
#: so SQLite's integer division and remainder are floor's), made into SQLAlchemy's stored
#: text by :func:`_sqlite_time_sql` as the statement runs, in SQLite's C code, in the
#: driver's thread with the GIL released
_YEAR_ONE = datetime(1, 1, 1, tzinfo=UTC)
_YEAR_ONE_TO_EPOCH = (_EPOCH - _YEAR_ONE) // timedelta(seconds=1)
_YEAR_ONES: dict[tzinfo, datetime] = {}


def _sqlite_us(value: datetime) -> int:
    """An aware time as whole microseconds since 0001-01-01 UTC: 0.9 us a value where its
    text (:func:`_sqlite_utc`) took 2.8 us, and a 300-refresh flush has 600 of them
    (tests/db/test_bulk.py pins that the statement makes the same text)."""
    tz = value.tzinfo
    if tz is None:
        raise ValueError("naive datetime given to the database; use aware datetimes")
    return (value - _in_zone(_YEAR_ONE, tz, _YEAR_ONES)) // _MICROSECOND


def _sqlite_time_sql(field: str) -> str:
    """The SQL making :func:`_sqlite_us`'s number in ``field`` the text SQLAlchemy stores
    (naive UTC, six digits of microseconds); NULL stays NULL."""
    return (f"strftime('%Y-%m-%d %H:%M:%S', {field} / 1000000 - {_YEAR_ONE_TO_EPOCH}, "
            f"'unixepoch') || printf('.%06d', {field} % 1000000)")


def _sqlite_unnest(dialect: Dialect, table: Table, split: _Columns, cols: tuple[str, ...],
                   first: Sequence[Any] | None = None) -> tuple[_SqliteParts, list[Any]]:
    """``split``'s columns as SQLite takes them, in the form SQLAlchemy stores each value
    (its type's bind processor; a time as a number the statement makes into that text):
    the columns that vary as one JSON text of rows (``first``: a column put before them
    in each row, ``$[0]``), each shared value once as a parameter, a column with an
    earlier one's values reading that one's field. The parameters are in the statement's
    order: the shared values in ``cols``' order, then the JSON text.

    As on PostgreSQL, the rows carry only what varies: a flush of refreshes done shares
    all but the consent and its time, and SQLite's ``json_extract`` parses a row's text
    again for each field it reads (3.40 keeps no parsed copy)."""
    skip = 0 if first is None else 1
    arrays = split.arrays
    procs = _sqlite_processors(dialect, table, arrays)
    times = {c for c in arrays if isinstance(table.c[c].type, UTCDateTime)}
    columns: list[list[Any]] = [] if first is None else [list(first)]
    for c, values, proc in zip(arrays, split.params[:len(arrays)], procs, strict=True):
        enc = _sqlite_us if c in times else proc
        columns.append(values if enc is None else
                       [None if v is None else enc(v) for v in values])
    same = dict(zip(split.scalars, split.params[len(arrays):], strict=True))
    source = dict(split.aliases)
    shared: list[Any] = []
    select: list[str] = []
    for c in cols:
        if c in same:
            (proc,) = _sqlite_processors(dialect, table, (c,))
            v = same[c]
            shared.append(v if v is None or proc is None else proc(v))
            select.append("?")
        else:
            field = source.get(c, c)
            select.append(_sqlite_time_sql(f"u.{field}") if field in times else f"u.{field}")
    fields = "".join(f", json_extract(value, '$[{k + skip}]') AS {c}"
                     for k, c in enumerate(arrays))
    return _SqliteParts(fields, tuple(select)), [*shared, _json(list(zip(*columns, strict=True)))]


def _processed(values: dict[str, Any], cols: tuple[str, ...],
               procs: tuple[Processor, ...]) -> list[Any]:
    out = [values[c] for c in cols]
    for k, p in enumerate(procs):
        if p is not None:
            v = out[k]
            if v is not None:
                out[k] = p(v)
    return out


def _json(rows: Sequence[Any]) -> str:
    return json.dumps(rows, separators=(",", ":"))


__all__ = ["OUTCOME_COLS", "Prepared", "held_by", "insert_outcomes", "is_postgresql", "pg_type",
           "prepare_outcomes", "prepare_outcomes_columns", "prepare_update",
           "prepare_update_columns", "set_where_held", "update_held"]
