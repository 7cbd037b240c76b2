"""``mydata-batch db init``."""

from __future__ import annotations

import click

from batch.cli import Settings, main, with_engine
from batch.db.engine import init_db, redact


@main.group("db")
def db_group() -> None:
    """Create or upgrade the database schema: `db init` is the one command here."""


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
