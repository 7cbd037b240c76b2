"""``mydata-batch run``: what cron starts every night."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from batch.cli import Settings, main, run_async
from batch.cli.options import WINDOW, clock_from_env, token_cipher
from batch.errors import ConfigError
from planning.windows import Window

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from batch.clock import Clock
    from batch.dispatch.summary import RunSummary


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
              help="Items per page of list calls (the MyData standard allows at most 500).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics while running.")
@click.option("--metrics-textfile", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE.prom",
              help="Write the metrics to FILE.prom (node exporter textfile collector format), "
                   "atomically, every minute and at the end.")
@click.option("--concurrency", type=click.IntRange(1, 10000), default=None, metavar="N",
              help="At most N calls in flight to any one provider from this worker (default: "
                   "the provider's max_concurrency; in cluster mode this worker's share of "
                   "it over the live workers, whichever is lower).")
@click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Cluster mode (--redis): start N worker processes on this machine under "
                   "one parent, which forwards SIGTERM/SIGINT and merges their summaries.")
@click.option("--heartbeat-seconds", type=click.FloatRange(0.1, 60), default=3.0,
              show_default=True, help="Cluster mode: seconds between worker heartbeats.")
@click.option("--dead-after-seconds", type=click.FloatRange(1, 3600), default=15.0,
              show_default=True,
              help="Cluster mode: a worker without a heartbeat this long is dead; its claims "
                   "are due again at once.")
@click.option("--cluster-namespace", default="mydata", show_default=True,
              help="Cluster mode: the prefix of this cluster's Redis keys.")
@click.option("--process-index", type=click.IntRange(0, 63), default=None, hidden=True,
              help="Set by --processes on each worker it starts: its metrics port, textfile "
                   "and `process` label (ObserveOptions.for_process).")
@click.option("--run-id", default=None, hidden=True,
              help="Set by --processes on each worker it starts, so that the parent can read "
                   "a worker's work back from the database if it dies without a summary.")
@click.pass_obj
def run_cmd(settings: Settings, windows: tuple[Window, ...], only: tuple[str, ...],
            as_json: bool, lease_seconds: int, grace_seconds: float, progress: str,
            worker_id: str | None, page_limit: int, log_level: str,
            metrics_port: int | None, metrics_textfile: Path | None,
            concurrency: int | None, processes: int,
            heartbeat_seconds: float, dead_after_seconds: float,
            cluster_namespace: str, process_index: int | None, run_id: str | None) -> None:
    """Run today's plan inside the providers' windows, then print the summary.

    Exit codes: 0 the day's work is done; 1 work left undone or failures an operator must
    see (dead letters, our own 4xx bugs, outcomes not written); 2 bad input or an
    unreachable database; 3 interrupted by SIGTERM/SIGINT (unstarted work released).

    With --redis (cluster mode) many runs share one database: each is a worker of the
    registry (`mydata-batch workers`), the plan's per-minute counts and the providers' rates
    are shared through Redis, and no run lock is taken.
    """
    from batch.observe.session import ObserveOptions

    redis_url = settings.redis_url
    observe = ObserveOptions(metrics_port=metrics_port, metrics_textfile=metrics_textfile)
    if processes > 1:
        observe.for_process(processes - 1)  # the last worker's port: one line if past 65535
    if process_index is not None:
        observe = observe.for_process(process_index)
    if processes > 1 and not redis_url:
        raise ConfigError("--processes needs cluster mode (--redis URL): without it two "
                          "runs on one database would double every provider's rate")
    if heartbeat_seconds >= dead_after_seconds:
        raise ConfigError("--heartbeat-seconds must be shorter than --dead-after-seconds")
    if redis_url:
        from batch.cluster.session import check_redis

        run_async(check_redis(redis_url))  # one line and exit 2 when it is not there
    if processes > 1:
        # what every worker would refuse, refused once here before any starts: the key, and
        # a database that is there with its schema
        token_cipher()
        run_async(_database_ready(settings.db_url))
        _run_processes(processes, worker_id, as_json, settings.db_url, log_level)
    from batch.db.engine import make_engine
    from batch.dispatch.runner import RunOptions, run_day
    from batch.logs import setup_logging

    kwargs: dict[str, object] = {}
    if worker_id:
        kwargs["worker_id"] = worker_id
    if run_id:
        kwargs["run_id"] = run_id
    options = RunOptions(
        window_override=tuple(windows) or None, only=tuple(only),
        lease=timedelta(seconds=lease_seconds), grace_seconds=grace_seconds,
        progress=progress, page_limit=page_limit, concurrency=concurrency,
        observe=observe,
        **kwargs,  # type: ignore[arg-type]
    )
    cipher = token_cipher()  # checked against the stored tokens before any call
    setup_logging(level=log_level, run_id=options.run_id, worker_id=options.worker_id)
    clock = clock_from_env()

    async def go() -> tuple[RunSummary, int]:
        import asyncio

        from batch.db.runlock import run_lock

        engine = make_engine(settings.db_url)
        try:
            if redis_url:  # cluster mode: many workers on one database are the point
                from batch.cluster.circuit import CircuitSettings
                from batch.cluster.session import ClusterOptions, ClusterSession

                session = ClusterSession(engine, clock=clock, options=ClusterOptions(
                    redis_url, heartbeat=heartbeat_seconds, dead_after=dead_after_seconds,
                    namespace=cluster_namespace,
                    circuit=CircuitSettings.from_spec(os.environ.get("MYDATA_CIRCUIT"))))
                res = await run_day(engine, clock=clock, cipher=cipher,
                                    options=replace(options, cluster=session))
                summary = await _cluster_wide(engine, res.summary, session.report(),
                                              worker=options.worker_id, clock=clock)
                return summary, summary.exit_code
            # one run per database (batch/db/runlock.py); a lock lost to another run
            # mid-run stops this one as SIGTERM would
            lost = asyncio.Event()
            async with run_lock(engine, on_lost=lost.set):
                res = await run_day(engine, clock=clock, options=options, cipher=cipher,
                                    stop=lost)
            return res.summary, res.exit_code
        finally:
            await engine.dispose()

    summary, code = run_async(go())
    _print(summary, as_json)
    sys.exit(code)


def _print(summary: RunSummary, as_json: bool) -> None:
    if as_json:
        click.echo(summary.dumps())
        return
    from batch.dispatch.summary import format_summary

    click.echo(format_summary(summary))
    for p in summary.providers:
        for c in [p.extra["cluster"]] if "cluster" in p.extra else p.extra.get("workers", []):
            if isinstance(c, dict) and c.get("redis_fallbacks"):
                click.echo(f"{p.org_code}: node {c.get('node_id')} ran on LOCAL limits "
                           f"(Redis lost {c['redis_fallbacks']} time(s), "
                           f"{c.get('redis_fallback_seconds')} s)")
            circuit = c.get("circuit") if isinstance(c, dict) else None
            if isinstance(circuit, dict) and (circuit.get("left_cluster")
                                              or circuit.get("mode") != "cluster"):
                click.echo(f"{p.org_code}: node {c.get('node_id')} cluster circuit view "
                           f"{circuit.get('mode')} at the end, modes seen "
                           f"{', '.join(circuit.get('modes_seen') or [])}, left the "
                           f"cluster's list {circuit.get('left_cluster')} time(s)")


async def _cluster_wide(engine: AsyncEngine, summary: RunSummary, report: dict[str, Any],
                        *, worker: str, clock: Clock) -> RunSummary:
    """Cluster mode: the summary judged cluster-wide (batch/cluster/view.py), stored again."""
    from datetime import date as _date

    from batch.cluster.view import seen_cluster_wide
    from batch.dispatch.runner import record

    out = await seen_cluster_wide(engine, summary, day=_date.fromisoformat(summary.date),
                                  me=worker, report=report, now=clock.now())
    await record(engine, out, clock=clock)
    # the step_record line before this one judged the worker alone; this is the verdict
    left = {p.org_code: p.extra["cluster"]["left_to_live_workers"] for p in out.providers
            if isinstance(p.extra.get("cluster"), dict)
            and p.extra["cluster"].get("left_to_live_workers")}
    logging.getLogger("mydata.run").info(
        "judged cluster-wide: %s", out.status, extra={
            "action": "step_cluster_judged", "run_id": out.run_id, "status": out.status,
            "exit_code": out.exit_code,
            "deferred": sum(p.counters["deferred"] for p in out.providers),
            **({"left_to_live_workers": left} if left else {})})
    return out


async def _database_ready(url: str) -> None:
    """One clear line (DatabaseError) if ``url`` is unreachable, missing or without the
    schema."""
    from sqlalchemy import select

    from batch.db import schema
    from batch.db.engine import connect, make_engine

    engine = make_engine(url)
    try:
        async with connect(engine) as conn:
            await conn.execute(select(schema.runs.c.run_id).limit(1))
    finally:
        await engine.dispose()


def _run_processes(n: int, worker_id: str | None, as_json: bool, db_url: str,
                   log_level: str) -> NoReturn:
    import socket

    from batch.cluster.processes import NoSummaries, run_children, worst_exit
    from batch.logs import setup_logging

    parent = worker_id or f"{socket.gethostname()}-{os.getpid()}"
    # the parent's own lines (a worker process that died) as its workers' are: JSON under cron
    setup_logging(level=log_level, worker_id=parent)
    try:
        summary, code = run_children(sys.argv[1:], n, worker_id=parent, db_url=db_url)
    except NoSummaries as exc:  # the workers' own lines say why: one more, and their code
        click.echo(f"mydata-batch: error: {exc}", err=True)
        sys.exit(worst_exit(exc.codes))
    _print(summary, as_json)
    sys.exit(code)
