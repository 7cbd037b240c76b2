"""``mydata-batch db reorder``: rewrite the consents table in the order claims read it.

A claim leases a provider's next due consents in keyset order (``due_week``, ``id``). When
the table holds each provider's consents next to each other in that order, a 700-row claim
touches some 40 pages; when a file that mixed every provider was loaded before the loader
wrote new consents in claim order (``batch/db/loaders.py``), each claimed row sits on a page
of its own, and every claim writes some 270 full pages to the WAL (the first change to each
page since the last checkpoint). This rewrites the table once, in (provider, due week, id)
order, at the table's fillfactor (50 since ``sql/010_claim_locality.sql``, which ``db init``
applies): ``CLUSTER`` on a temporary index, dropped in the same transaction. Ids do not
change, so nothing that refers to a consent does either.

PostgreSQL only. ``CLUSTER`` holds an exclusive lock on the table while it runs (minutes on
10,000,000 consents): the command takes the run lock and is refused while any worker is
alive (the CLI checks the worker registry), and waits at most ``lock_timeout`` for readers
such as a dashboard to let go of the table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db.engine import database_error, redact
from batch.db.runlock import run_lock
from batch.errors import InputError

_TEMP_INDEX = "consents_reorder_tmp"


@dataclass(frozen=True, slots=True)
class Reordered:
    """What a reorder did: the rows rewritten, the table's size (with its indexes) before
    and after, and how long it held the table."""

    rows: int
    bytes_before: int
    bytes_after: int
    seconds: float


async def reorder_consents(engine: AsyncEngine, *, lock_timeout: float = 10.0) -> Reordered:
    """Rewrite ``consents`` in claim order (one transaction, all or nothing; the run lock
    held). InputError if the table stays in use for ``lock_timeout`` seconds."""
    if engine.dialect.name != "postgresql":
        raise InputError("db reorder is for PostgreSQL: an SQLite file keeps its rows in id "
                         "order and cannot be reordered without new ids")
    if lock_timeout <= 0:
        raise InputError(f"--lock-timeout must be positive, not {lock_timeout:g}")
    async with run_lock(engine):
        t0 = time.perf_counter()
        try:
            async with engine.begin() as conn:
                await conn.exec_driver_sql(
                    f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'")
                # the table first: a reader that holds it makes this wait, not the index build
                await conn.exec_driver_sql("LOCK TABLE consents IN ACCESS EXCLUSIVE MODE")
                before = int((await conn.exec_driver_sql(
                    "SELECT pg_total_relation_size('consents')")).scalar_one())
                await conn.exec_driver_sql(f"DROP INDEX IF EXISTS {_TEMP_INDEX}")
                await conn.exec_driver_sql(
                    f"CREATE INDEX {_TEMP_INDEX} ON consents (org_code, due_week, id)")
                await conn.exec_driver_sql(f"CLUSTER consents USING {_TEMP_INDEX}")
                await conn.exec_driver_sql(f"DROP INDEX {_TEMP_INDEX}")
                await conn.exec_driver_sql("ANALYZE consents")
                rows = int((await conn.exec_driver_sql(
                    "SELECT count(*) FROM consents")).scalar_one())
                after = int((await conn.exec_driver_sql(
                    "SELECT pg_total_relation_size('consents')")).scalar_one())
        except (OperationalError, DBAPIError, OSError) as exc:
            if getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03":  # lock wait
                raise InputError(
                    f"the consents table at {redact(str(engine.url))} is in use (a dashboard "
                    f"or another session held it for {lock_timeout:g} s): nothing was "
                    "changed; stop what reads it and run db reorder again") from None
            raise database_error(exc, str(engine.url)) from None
    return Reordered(rows, before, after, time.perf_counter() - t0)
