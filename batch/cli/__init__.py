"""The ``mydata-batch`` command: a thin click shell over the package.

Each command lives in its own module here and registers itself on :data:`main`. Errors a
user can cause (bad files, bad options, an unreachable database) print one line and exit 2.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from batch.db.engine import db_url_from_env
from batch.errors import MydataError

T = TypeVar("T")
EXIT_USER_ERROR = 2


@dataclass(frozen=True, slots=True)
class Settings:
    """What every command gets from the group options."""

    db_url: str
    redis_url: str | None


class MydataGroup(click.Group):
    """Turns every MydataError into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MydataError as exc:
            click.echo(f"mydata-batch: error: {exc}", err=True)
            ctx.exit(EXIT_USER_ERROR)


@click.group(cls=MydataGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", envvar="MYDATA_DB_URL", default=None, metavar="URL",
              help="Database URL: sqlite+aiosqlite:///file.db (default mydata.db) or "
                   "postgresql+asyncpg://user@host/db. Env: MYDATA_DB_URL.")
@click.option("--redis", "redis_url", envvar="MYDATA_REDIS_URL", default=None, metavar="URL",
              help="Redis URL for cluster mode (a rate limit and circuit shared by many "
                   "workers). Not available in this version: `run` refuses it rather than "
                   "run unshared. Env: MYDATA_REDIS_URL.")
@click.version_option(package_name="mydata-batch")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, redis_url: str | None) -> None:
    """Refresh every MyData consent once a week, inside each provider's windows, flat.

    \b
    Typical night:
      mydata-batch db init
      mydata-batch load institutions institutions.toml
      mydata-batch load consents consents.csv
      mydata-batch plan --save
      mydata-batch run
    Try everything at once on a throw-away SQLite file: mydata-batch demo
    """
    ctx.obj = Settings(db_url=db_url_from_env(db_url), redis_url=redis_url)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """The CLI's one ``asyncio.run``."""
    return asyncio.run(coro)


def with_engine(settings: Settings, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Open the engine, run ``fn(engine)``, always dispose."""
    from batch.db.engine import make_engine

    async def _go() -> T:
        engine = make_engine(settings.db_url)
        try:
            return await fn(engine)
        finally:
            await engine.dispose()

    return run_async(_go())


def _register() -> None:
    # Imported for their side effect: each module adds its command(s) to ``main``.
    import importlib

    for name in ("db", "load", "seed", "plan", "run", "dashboard", "simulate", "demo",
                 "requeue", "check"):
        try:
            importlib.import_module(f"batch.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"batch.cli.{name}":
                raise


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
