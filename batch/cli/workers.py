"""``mydata-batch workers``: the cluster's workers, live and dead, and what they hold."""

from __future__ import annotations

import json

import click

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env


@main.command("workers")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per worker.")
@click.option("--all", "show_all", is_flag=True,
              help="Workers of any age (default: those heard from in the last day).")
def workers_cmd(as_json: bool, show_all: bool) -> None:
    """List the workers (each `run`): live, dead (no heartbeat within its timeout) or
    stopped; their claims (consents leased by them, and of those marked started) and their
    last heartbeat, oldest start first. A dead worker's claims are due again once a live
    worker sees the death (or its leases end)."""
    from datetime import UTC, datetime

    from batch.cluster.registry import list_workers

    settings: Settings = click.get_current_context().obj
    now = clock_from_env().now()
    since = datetime(1970, 1, 1, tzinfo=UTC) if show_all else None
    rows = with_engine(settings, lambda e: list_workers(e, now=now, since=since))
    if as_json:
        for w in rows:
            click.echo(json.dumps({
                "node_id": w.node_id, "worker_id": w.worker_id, "host": w.host, "pid": w.pid,
                "run_id": w.run_id, "state": w.state, "cluster": w.cluster,
                "started_at": w.started_at.isoformat(),
                "heartbeat_at": w.heartbeat_at.isoformat(),
                "stopped_at": w.stopped_at.isoformat() if w.stopped_at else None,
                "dead_seen_at": w.dead_seen_at.isoformat() if w.dead_seen_at else None,
                "claims": w.claims, "started_claims": w.started}))
        return
    if not rows:
        click.echo("no workers")
        return
    head = (f"{'node':>6}  {'state':<7}  {'worker':<24}  {'host':<16}  {'pid':>7}  "
            f"{'claims':>7}  {'started':>7}  last heartbeat")
    click.echo(head)
    click.echo("-" * len(head))
    for w in rows:
        click.echo(f"{w.node_id:>6}  {w.state:<7}  {w.worker_id[:24]:<24}  {w.host[:16]:<16}  "
                   f"{w.pid:>7}  {w.claims:>7}  {w.started:>7}  "
                   f"{w.heartbeat_at.isoformat(timespec='seconds')}")
    live = sum(1 for w in rows if w.state == "live")
    click.echo(f"{live} live, {sum(1 for w in rows if w.state == 'dead')} dead, "
               f"{sum(1 for w in rows if w.state == 'stopped')} stopped")
