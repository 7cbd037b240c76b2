"""``mydata-batch load institutions|consents|usage FILE``: validated loads, all or nothing."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env, token_cipher
from batch.config import load_institutions as read_institutions_file
from batch.db.engine import init_db, redact
from batch.db.loaders import (
    load_consents,
    load_institutions,
    load_usage,
    missing_providers,
    usage_history,
)
from planning.calendar import kst_date
from planning.usage import MAX_HISTORY_DAYS, MIN_TREND_DAYS

_FILE = click.Path(dir_okay=False, path_type=Path)
_IGNORE_EXTRA = click.option(
    "--ignore-extra-columns", "ignore_extra", is_flag=True,
    help="Skip header columns this file format does not have (default: refuse the file).")


class TerminalProgress:
    """A file's rows read so far, on one line of a terminal (stderr), at most a few times a
    second; off a terminal (cron) it says nothing: the final ``loaded ...`` line is the log.
    """

    EVERY = 0.25  # seconds between redraws

    def __init__(self, file: Path, stream: TextIO | None = None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._on = self._stream.isatty()
        self._name = file.name
        self._t0 = time.monotonic()
        self._last = 0.0
        self._shown = False

    def __call__(self, rows: int, fraction: float) -> None:
        now = time.monotonic()
        if not self._on or (fraction < 1.0 and now - self._last < self.EVERY):
            return
        self._last = now
        tail = "; writing them to the database" if fraction >= 1.0 else ""
        self._stream.write(f"\rreading {self._name}: {rows:,} rows ({fraction:.0%}) in "
                           f"{now - self._t0:.1f} s{tail}\x1b[K")
        self._stream.flush()
        self._shown = True

    def close(self) -> None:
        """End the progress line (before the result or an error is printed)."""
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = False


def _load(settings: Settings, what: str, file: Path,
          loader: Callable[[AsyncEngine], Awaitable[int]],
          after: Callable[[AsyncEngine], Awaitable[list[str]]] | None = None,
          progress: TerminalProgress | None = None) -> None:
    """Create the schema if needed, run ``loader`` (one transaction), say what it loaded,
    then print the warnings of ``after``; ``progress`` (the loader's) ends its line first."""
    async def go(engine: AsyncEngine) -> tuple[int, list[str]]:
        await init_db(engine)
        n = await loader(engine)
        return n, (await after(engine) if after is not None else [])

    try:
        n, warnings = with_engine(settings, go)
    finally:
        if progress is not None:
            progress.close()
    click.echo(f"loaded {n} {what} from {file} into {redact(settings.db_url)}")
    for line in warnings:
        click.echo(f"warning: {line}", err=True)


@main.group("load")
def load_group() -> None:
    """Load institutions, consents or usage history into the database.

    \b
    Each file is checked in full first: any bad row prints one line naming the file, the
    line and the field, exits with code 2, and writes nothing. Loading again updates
    (upserts) what is there. The schema is created if the database is new.
    Formats: docs/operator.md.
    """


@load_group.command("institutions")
@click.argument("file", type=_FILE)
@click.option("--retire-missing", is_flag=True,
              help="Retire the providers in the database that FILE no longer lists (never "
                   "planned or called again; loading them again brings them back). "
                   "Without it such a file is refused.")
@click.option("--change-operator-org-code", "change_operator", is_flag=True,
              help="Accept a new operator_org_code (it is in every transaction id).")
@click.pass_obj
def load_institutions_cmd(settings: Settings, file: Path, retire_missing: bool,
                          change_operator: bool) -> None:
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
    An unknown key at any level is refused with its line and the closest known key.
    """
    insts = read_institutions_file(file)
    retired: list[str] = []

    async def load(engine: AsyncEngine) -> int:
        if retire_missing:
            retired.extend(await missing_providers(engine, insts))
        return await load_institutions(engine, insts, now=clock_from_env().now(),
                                       source=str(file), retire_missing=retire_missing,
                                       change_operator=change_operator)

    _load(settings, "institutions", file, load)
    if retired:
        click.echo(f"retired {len(retired)} provider(s): {', '.join(retired)} (never planned "
                   "or called again; load them again to bring them back)")


@load_group.command("consents")
@click.argument("file", type=_FILE)
@_IGNORE_EXTRA
@click.pass_obj
def load_consents_cmd(settings: Settings, file: Path, ignore_extra: bool) -> None:
    """Load consents from FILE.csv (load institutions first).

    \b
    Header row naming the columns, in any order:
    user_id,org_code,access_token,consented_at,last_scheduled_at and optionally
    refresh_token. Timestamps are ISO 8601 (2026-11-29T09:00:00+09:00; no offset means
    KST); last_scheduled_at is empty for a consent never fetched. Re-loading updates
    tokens; the weekly schedule never moves back; a revoked consent stays revoked unless
    the row carries a newer consented_at. Tokens are stored encrypted with the key of
    MYDATA_TOKEN_KEYS or MYDATA_TOKEN_KEY_FILE (`mydata-batch keys generate`).
    """
    cipher = token_cipher()  # a missing or malformed key: one line, nothing opened
    progress = TerminalProgress(file)
    _load(settings, "consents", file,
          lambda engine: load_consents(engine, file, now=clock_from_env().now(),
                                       cipher=cipher, ignore_extra=ignore_extra,
                                       progress=progress), progress=progress)


@load_group.command("usage")
@click.argument("file", type=_FILE)
@_IGNORE_EXTRA
@click.pass_obj
def load_usage_cmd(settings: Settings, file: Path, ignore_extra: bool) -> None:
    """Load daily user-initiated call counts from FILE.csv (load institutions first).

    \b
    Header row: org_code,date,user_calls (any order)   e.g.  BANK000001,2026-11-28,182340
    One row per provider per day gone by (a future date is refused); the planner learns
    each provider's load shape from it and warns of a history too short to forecast.
    """
    now = clock_from_env().now()

    async def warnings(engine: AsyncEngine) -> list[str]:
        spans = await usage_history(engine, today=kst_date(now), days=MAX_HISTORY_DAYS)
        return [history_warning(org, n, span) for org, (n, span) in spans.items()
                if span < MIN_TREND_DAYS]

    progress = TerminalProgress(file)
    _load(settings, "usage rows", file,
          lambda engine: load_usage(engine, file, now=now, ignore_extra=ignore_extra,
                                    progress=progress),
          warnings, progress=progress)


def history_warning(org: str, days: int, span: int) -> str:
    """What the forecast falls back to for a provider with too little usage history."""
    if days == 0:
        return (f"{org} has no usage history in the last {MAX_HISTORY_DAYS} days: its "
                "forecast is 0 user calls a day (no known user load)")
    return (f"{org} has {days} day(s) of usage history over {span} day(s); the forecast "
            f"needs {MIN_TREND_DAYS} days for a trend: it uses their level, no trend, and "
            "the weekday shape pooled over all providers")
