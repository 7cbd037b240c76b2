"""``mydata-batch run``: what cron starts every night."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import click

from batch.cli import Settings, main, run_async
from batch.cli.options import WINDOW, clock_from_env, token_cipher
from batch.errors import ConfigError
from planning.windows import Window


@main.command("run")
@click.option("--window-override", "windows", type=WINDOW, multiple=True,
              help="Replace every provider's windows for this run (HHMM:HHMM, any minute; "
                   "repeat for several). For catch-up runs, tests and the demo.")
@click.option("--only", multiple=True, metavar="ORG_CODE",
              help="Run only these providers (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--lease-seconds", type=click.IntRange(5, 86400), default=600, show_default=True,
              help="How long a claim stays ours; a crashed worker's claims return after it.")
@click.option("--grace-seconds", type=click.FloatRange(0, 3600), default=30.0,
              show_default=True, help="On SIGTERM/SIGINT, how long in-flight calls may finish.")
@click.option("--progress", type=click.Choice(["auto", "tty", "log", "none"]), default="auto",
              show_default=True,
              help="Live lines on a terminal, a log line per provider per minute under cron.")
@click.option("--worker-id", default=None, help="This worker's id (default host-pid).")
@click.option("--page-limit", type=click.IntRange(1, 500), default=500, show_default=True,
              help="Items per page of list calls (MYDATA.md: at most 500).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics while running.")
@click.option("--metrics-textfile", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE.prom",
              help="Write the metrics to FILE.prom (node exporter textfile collector format), "
                   "atomically, every minute and at the end.")
@click.pass_obj
def run_cmd(settings: Settings, windows: tuple[Window, ...], only: tuple[str, ...],
            as_json: bool, lease_seconds: int, grace_seconds: float, progress: str,
            worker_id: str | None, page_limit: int, log_level: str,
            metrics_port: int | None, metrics_textfile: Path | None) -> None:
    """Run today's plan inside the providers' windows, then print the summary.

    Exit codes: 0 the day's work is done; 1 work left undone or failures an operator must
    see (dead letters, our own 4xx bugs, outcomes not written); 2 bad input or an
    unreachable database; 3 interrupted by SIGTERM/SIGINT (unstarted work released).
    """
    if settings.redis_url:
        raise ConfigError(
            "cluster mode (--redis / MYDATA_REDIS_URL) is not available in this version; "
            "run a single worker per database without it")
    from batch.db.engine import make_engine
    from batch.dispatch.runner import RunOptions, run_day
    from batch.dispatch.summary import RunSummary, format_summary
    from batch.logs import setup_logging
    from batch.observe.session import ObserveOptions

    kwargs: dict[str, object] = {}
    if worker_id:
        kwargs["worker_id"] = worker_id
    options = RunOptions(
        window_override=tuple(windows) or None, only=tuple(only),
        lease=timedelta(seconds=lease_seconds), grace_seconds=grace_seconds,
        progress=progress, page_limit=page_limit,
        observe=ObserveOptions(metrics_port=metrics_port, metrics_textfile=metrics_textfile),
        **kwargs,  # type: ignore[arg-type]
    )
    cipher = token_cipher()  # checked against the stored tokens before any call
    setup_logging(level=log_level, run_id=options.run_id, worker_id=options.worker_id)
    clock = clock_from_env()

    async def go() -> tuple[RunSummary, int]:
        from batch.db.runlock import run_lock

        engine = make_engine(settings.db_url)
        try:
            async with run_lock(engine):  # one run per database (batch/db/runlock.py)
                res = await run_day(engine, clock=clock, options=options, cipher=cipher)
            return res.summary, res.exit_code
        finally:
            await engine.dispose()

    summary, code = run_async(go())
    if as_json:
        click.echo(summary.dumps())
    else:
        click.echo(format_summary(summary))
    sys.exit(code)
