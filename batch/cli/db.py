"""``mydata-batch db init``."""

from __future__ import annotations

import click

from batch.cli import Settings, main, with_engine
from batch.db.engine import init_db, redact


@main.group("db")
def db_group() -> None:
    """Create or inspect the database schema."""


@db_group.command("init")
@click.pass_obj
def db_init(settings: Settings) -> None:
    """Create the schema (idempotent: safe to run again on an existing database)."""
    version = with_engine(settings, init_db)
    click.echo(f"schema version {version} ready at {redact(settings.db_url)}")
