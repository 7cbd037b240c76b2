"""``mydata-batch load institutions|consents|usage FILE``: validated loads, all or nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env
from batch.config import load_institutions as read_institutions_file
from batch.db.engine import init_db, redact
from batch.db.loaders import load_consents, load_institutions, load_usage

_FILE = click.Path(dir_okay=False, path_type=Path)


def _load(settings: Settings, what: str, file: Path,
          loader: Callable[[AsyncEngine], Awaitable[int]]) -> None:
    """Create the schema if needed, run ``loader`` (one transaction), say what it loaded."""
    async def go(engine: AsyncEngine) -> int:
        await init_db(engine)
        return await loader(engine)

    n = with_engine(settings, go)
    click.echo(f"loaded {n} {what} from {file} into {redact(settings.db_url)}")


@main.group("load")
def load_group() -> None:
    """Load institutions, consents or usage history into the database.

    \b
    Each file is checked in full first: any bad row prints one line naming the file, the
    line and the field, exits with code 2, and writes nothing. Loading again updates
    (upserts) what is there. The schema is created if the database is new.
    """


@load_group.command("institutions")
@click.argument("file", type=_FILE)
@click.pass_obj
def load_institutions_cmd(settings: Settings, file: Path) -> None:
    """Load providers (windows, limits) and the operator org code from FILE.toml.

    \b
    operator_org_code = "OPERATOR01"
    [[providers]]
    org_code = "BANK000001"
    industry = "bank"
    base_url = "http://127.0.0.1:9001"
    windows = ["0030:0530", "2200:2400"]   # KST, 30-minute steps, at most 3, >= 6 h
    calls_per_second = 50
    max_concurrency = 20
    """
    insts = read_institutions_file(file)
    _load(settings, "institutions", file,
          lambda engine: load_institutions(engine, insts, now=clock_from_env().now()))


@load_group.command("consents")
@click.argument("file", type=_FILE)
@click.pass_obj
def load_consents_cmd(settings: Settings, file: Path) -> None:
    """Load consents from FILE.csv (load institutions first).

    \b
    Header row: user_id,org_code,access_token,consented_at,last_scheduled_at
    optionally followed by ,refresh_token. Timestamps are ISO 8601
    (2026-11-29T09:00:00+09:00; no offset means KST); last_scheduled_at is empty for a
    consent never fetched. Re-loading updates tokens; the weekly schedule never moves back.
    """
    _load(settings, "consents", file,
          lambda engine: load_consents(engine, file, now=clock_from_env().now()))


@load_group.command("usage")
@click.argument("file", type=_FILE)
@click.pass_obj
def load_usage_cmd(settings: Settings, file: Path) -> None:
    """Load daily user-initiated call counts from FILE.csv (load institutions first).

    \b
    Header row: org_code,date,user_calls   e.g.  BANK000001,2026-11-28,182340
    One row per provider per day; the planner learns each provider's load shape from it.
    """
    _load(settings, "usage rows", file, lambda engine: load_usage(engine, file))
