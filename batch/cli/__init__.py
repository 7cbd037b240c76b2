"""The ``mydata-batch`` command: a thin click shell over the package.

Each command lives in its own module here and registers itself on :data:`main`. Errors a
user can cause (bad files, bad options, an unreachable database) print one line and exit 2:
once, here, for every command (:class:`MydataCommand`).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError

from batch.db.engine import (
    MAY_CREATE,
    MUST_EXIST,
    check_sqlite_target,
    database_error,
    db_url_from_env,
    sqlite_path,
)
from batch.errors import MydataError

T = TypeVar("T")
EXIT_USER_ERROR = 2
DOCS = "docs/operator.md"

#: What each command does with the database (by its path under ``mydata-batch``):
#: MAY_CREATE may start from a new SQLite file, NO_DB never opens one (and takes no --db);
#: every other command needs a database that exists (a typo is not a new empty file).
NO_DB = "none"
_DB_USE = {"db init": MAY_CREATE, "load": MAY_CREATE, "seed": MAY_CREATE, "demo": NO_DB,
           "simulate": NO_DB, "keys generate": NO_DB}


@dataclass(frozen=True, slots=True)
class Settings:
    """What every command gets from the group options."""

    db_url: str
    redis_url: str | None


def _db_use(ctx: click.Context) -> str:
    names: list[str] = []
    node: click.Context | None = ctx
    while node is not None and node.parent is not None:  # the root's name is the program's
        names.insert(0, node.info_name or "")
        node = node.parent
    path = " ".join(names)
    while path:
        if path in _DB_USE:
            return _DB_USE[path]
        path = path.rsplit(" ", 1)[0] if " " in path else ""
    return MUST_EXIST


def _set_setting(name: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None and isinstance(ctx.obj, Settings):
            ctx.obj = replace(ctx.obj, **{name: value})
    return callback


def _shared_options() -> list[click.Parameter]:
    """``--db`` and ``--redis`` on every command, so they work after the command name too
    (``mydata-batch plan --db URL``); a value given there wins over the one before it."""
    return [
        click.Option(["--db"], metavar="URL", expose_value=False, callback=_set_setting("db_url"),
                     help="Database URL (as before the command; env MYDATA_DB_URL)."),
        click.Option(["--redis"], metavar="URL", expose_value=False,
                     callback=_set_setting("redis_url"),
                     help="Redis URL (as before the command; env MYDATA_REDIS_URL)."),
    ]


def one_line_error(ctx: click.Context, exc: BaseException) -> NoReturn:
    """Print ``mydata-batch: error: ...`` for an error a user can cause and exit 2."""
    if isinstance(exc, MydataError):
        message = str(exc)
    else:
        url = ctx.obj.db_url if isinstance(ctx.obj, Settings) else db_url_from_env()
        message = str(database_error(exc, url))
    click.echo(f"mydata-batch: error: {message}", err=True)
    ctx.exit(EXIT_USER_ERROR)


#: Failures of the database layer that reach a command: one line, never a traceback.
_DB_FAILURES = (SQLAlchemyError, ConnectionError, socket.gaierror)


class MydataCommand(click.Command):
    """A command with the shared options; refuses a mistyped SQLite path before anything
    opens it, and turns every error a user can cause into one line and exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if _DB_USE.get(self.name or "") != NO_DB:
            self.params.extend(_shared_options())

    def invoke(self, ctx: click.Context) -> Any:
        new_file: Path | None = None
        try:
            use = _db_use(ctx)
            if use != NO_DB and isinstance(ctx.obj, Settings):
                check_sqlite_target(ctx.obj.db_url, use)
                path = sqlite_path(ctx.obj.db_url) if use == MAY_CREATE else None
                new_file = path if path is not None and not path.exists() else None
            return super().invoke(ctx)
        except (MydataError, *_DB_FAILURES) as exc:
            _remove_new_sqlite(new_file)
            one_line_error(ctx, exc)


def _remove_new_sqlite(path: Path | None) -> None:
    """A refused command leaves nothing behind: not even the SQLite file it created (a
    mistyped path would otherwise hold a schema, and the next command would read it)."""
    if path is None:
        return
    for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        p.unlink(missing_ok=True)


class MydataGroup(click.Group):
    """The root: every MydataError becomes one line on stderr and exit code 2, and so do
    click's own usage errors (``mydata-batch: error: ...``, no usage block)."""

    command_class = MydataCommand

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MydataError as exc:
            one_line_error(ctx, exc)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            rv = 0
        except click.UsageError as exc:
            hint = ""
            if exc.ctx is not None:
                hint = f" (see '{exc.ctx.command_path} --help')"
            click.echo(f"mydata-batch: error: {_one_line(exc.format_message())}{hint}",
                       err=True)
            rv = exc.exit_code
        except click.ClickException as exc:
            click.echo(f"mydata-batch: error: {_one_line(exc.format_message())}", err=True)
            rv = exc.exit_code
        except click.Abort:
            click.echo("mydata-batch: aborted", err=True)
            rv = 1
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _one_line(text: str) -> str:
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip())


class MydataSubGroup(MydataGroup):
    """A group under the root (``db``, ``load``): it takes the shared options too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_shared_options())


MydataGroup.group_class = MydataSubGroup


@click.group(cls=MydataGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", envvar="MYDATA_DB_URL", default=None, metavar="URL",
              help="Database URL: sqlite+aiosqlite:///file.db (default mydata.db) or "
                   "postgresql+asyncpg://user@host/db. Env: MYDATA_DB_URL.")
@click.option("--redis", "redis_url", envvar="MYDATA_REDIS_URL", default=None, metavar="URL",
              help="Redis URL for cluster mode: `run` becomes a worker of one cluster (the "
                   "plan's per-minute counts, the providers' rates and circuits shared by "
                   "every worker; docs/operator.md). Env: MYDATA_REDIS_URL.")
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
    Every command, file format and exit code: docs/operator.md (in the source tree).
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
                 "requeue", "check", "revoke", "circuit", "keys", "workers"):
        try:
            importlib.import_module(f"batch.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"batch.cli.{name}":
                raise


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
