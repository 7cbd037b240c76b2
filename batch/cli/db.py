"""``mydata-batch db init`` and ``db reorder``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from batch.cli import Settings, main, with_engine
from batch.db.engine import init_db, redact

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from batch.db.reorder import Reordered


@main.group("db")
def db_group() -> None:
    """Create or upgrade the database schema (`db init`); rewrite the consents table in
    claim order (`db reorder`, PostgreSQL)."""


@db_group.command("init")
@click.pass_obj
def db_init(settings: Settings) -> None:
    """Create the schema, or bring an older one up to date (idempotent: safe to run again).

    \b
    SQLite: the file is created if its directory exists.
    PostgreSQL: the database must exist first (createdb -h HOST -U USER NAME).
    """
    version = with_engine(settings, init_db)
    click.echo(f"schema version {version} ready at {redact(settings.db_url)}")


@db_group.command("reorder")
@click.option("--lock-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="SECONDS",
              help="How long to wait for readers of the table to let go.")
@click.pass_obj
def db_reorder(settings: Settings, lock_timeout: float) -> None:
    """Rewrite the consents table in the order claims read it (PostgreSQL).

    \b
    Each provider's consents end up next to each other, by due week and id, so a claim's
    rows share a few pages instead of one page each (far less WAL a claim). Needed once for
    a table loaded before version 10 (`load consents` now inserts in that order). It locks
    the table while it runs (minutes at millions of consents): it is refused while a run or
    any worker is alive; run it between nights, after `db init`.
    """
    from batch.cli.options import clock_from_env
    from batch.cluster.registry import live_workers
    from batch.db.reorder import reorder_consents
    from batch.errors import InputError

    now = clock_from_env().now()

    async def _go(engine: AsyncEngine) -> Reordered:
        if engine.dialect.name == "postgresql":
            live = await live_workers(engine, now=now)
            if live:
                names = ", ".join(f"{w.worker_id} on {w.host} pid {w.pid}" for w in live[:3])
                raise InputError(
                    f"{len(live)} worker(s) alive on {redact(settings.db_url)} ({names}): "
                    "db reorder locks the consents table for minutes; run it between runs")
        return await reorder_consents(engine, lock_timeout=lock_timeout)

    done = with_engine(settings, _go)
    click.echo(f"reordered {done.rows:,} consents in {done.seconds:.1f} s at "
               f"{redact(settings.db_url)}: {done.bytes_before / 2**20:,.0f} MiB -> "
               f"{done.bytes_after / 2**20:,.0f} MiB with indexes")
