"""``mydata-batch check``: the alerts, for cron or a monitoring system."""

from __future__ import annotations

import sys

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env

EXIT_HEALTHY = 0
EXIT_BREACH = 1


@main.command("check")
@click.option("--thresholds", "thresholds_file", type=click.Path(dir_okay=False),
              default=None, metavar="FILE.toml",
              help="Thresholds: [defaults] and [providers.ORG_CODE] tables (unknown keys are "
                   "refused). Default: the built-in thresholds.")
@click.option("--run-id", default=None, help="Evaluate this run (default: the latest).")
@click.option("-v", "--verbose", is_flag=True, help="Say so when everything is healthy.")
@click.pass_obj
def check(settings: Settings, thresholds_file: str | None, run_id: str | None,
          verbose: bool) -> None:
    """Evaluate the last run and the current state against thresholds: retry ratio,
    max-attempt ratio, p99 latency, timeout rate, minutes a breaker was open, dead-letter
    age, consents overdue, no successful run in N hours.

    Prints one line per breach and exits 1; exits 0 (silent) when healthy, 2 on bad input.
    """
    from batch.observe.health import evaluate, read_health
    from batch.observe.thresholds import load_thresholds

    thresholds = load_thresholds(thresholds_file)
    clock = clock_from_env()
    now = clock.now()

    async def go(engine: AsyncEngine) -> list[str]:
        # A probe only reads: a database without the schema is refused (one line, exit 2),
        # never created here.
        health = await read_health(engine, now=now, run_id=run_id)
        return [b.line() for b in evaluate(health, thresholds, now=now)]

    lines = with_engine(settings, go)
    for line in lines:
        click.echo(line)
    if not lines and verbose:
        click.echo("ok: no threshold breached")
    sys.exit(EXIT_BREACH if lines else EXIT_HEALTHY)
