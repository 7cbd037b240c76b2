"""``mydata-batch dashboard``: the week's load and run health as one HTML page, or live."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from datetime import date, datetime
from pathlib import Path

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env
from batch.dashboard import server
from batch.dashboard.page import dashboard_html, write_page


@main.command("dashboard")
@click.option("--week", type=click.DateTime(formats=["%Y-%m-%d"]), default=None,
              metavar="DATE", help="Any date in the week to show (YYYY-MM-DD, KST). "
                                   "Default: the current week (Sunday to Saturday, KST).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("dashboard.html"), show_default=True, metavar="FILE.html",
              help="Where to write the self-contained page.")
@click.option("--serve", is_flag=True,
              help="Serve the page live instead of writing a file (Ctrl-C stops).")
@click.option("--host", default=server.DEFAULT_HOST, show_default=True,
              help="With --serve: the address to bind. Anything but loopback exposes "
                   "operational data to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=server.DEFAULT_PORT,
              show_default=True, help="With --serve: the port (0 picks a free one).")
@click.option("--refresh", "refresh_seconds", type=click.IntRange(min=1),
              default=server.DEFAULT_REFRESH, show_default=True, metavar="SECONDS",
              help="With --serve: how often the page reloads itself.")
@click.pass_obj
def dashboard(settings: Settings, week: datetime | None, out: Path, serve: bool, host: str,
              port: int, refresh_seconds: int) -> None:
    """Show a week's per-day load (user calls and batch, planned and done), today's plan
    against what is done, and run health (runs, outcomes, dead letters, capacity).

    \b
    Write a page to open in any browser (it needs no network):
      mydata-batch dashboard --out dashboard.html
    Serve it live on http://127.0.0.1:8050/ (JSON at /api/summary.json):
      mydata-batch dashboard --serve
    """
    clock = clock_from_env()
    day: date | None = week.date() if week is not None else None
    if not serve:
        async def write(engine: AsyncEngine) -> str:
            return await dashboard_html(engine, now=clock.now(), week=day)

        click.echo(str(write_page(with_engine(settings, write), out)))
        return

    if not server.is_loopback(host):
        click.echo(f"warning: binding to {host}, not a loopback address: anyone who can "
                   "reach this machine can read the dashboard", err=True)
    opts = server.ServerSettings(host=host, port=port, refresh_seconds=refresh_seconds,
                                 week=day)

    async def serve_forever(engine: AsyncEngine) -> None:
        running = await server.start(engine, clock, opts)
        click.echo(f"dashboard on {running.url} (JSON at {running.url}api/summary.json); "
                   "Ctrl-C stops", err=False)
        sys.stdout.flush()
        # The loop's own signal handlers, not asyncio.run's KeyboardInterrupt: a signal the
        # kernel hands to another thread (SQLite's driver thread) still wakes the loop
        # through its wake-up fd. With asyncio.run's handler it did not: the loop slept on
        # in select() with nothing due, and Ctrl-C never stopped the server.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await running.stop()

    with contextlib.suppress(KeyboardInterrupt):
        with_engine(settings, serve_forever)
    click.echo("stopped", err=True)
