"""``mydata-batch requeue``: send dead-lettered consents back into this week's work."""

from __future__ import annotations

import click

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env


@main.command("requeue")
@click.option("--org", "org_code", default=None, metavar="ORG_CODE",
              help="Only this provider's dead letters.")
@click.option("--id", "ids", type=int, multiple=True, help="Only these dead-letter ids.")
@click.option("--all", "all_", is_flag=True, help="Every open dead letter.")
@click.option("--list", "list_only", is_flag=True,
              help="List open dead letters (of --org if given); change nothing.")
@click.pass_obj
def requeue_cmd(settings: Settings, org_code: str | None, ids: tuple[int, ...], all_: bool,
                list_only: bool) -> None:
    """Requeue dead-lettered consents: due again this week, attempts reset.

    Choose what with --org, --id (repeatable) or --all; --list only shows them. A consent
    fetched this week since, or leased by a running worker, is not requeued: one line
    says so per dead letter. An --org or --id that names nothing is an error (exit 2).
    """
    from batch.db.deadletters import list_open, requeue

    if list_only and (ids or all_):
        raise click.UsageError("--list shows dead letters; it does not take --id or --all")
    if all_ and (org_code or ids):
        raise click.UsageError("--all means every open dead letter; drop --org/--id, or "
                               "drop --all")
    clock = clock_from_env()
    if list_only:
        rows = with_engine(settings, lambda e: list_open(e, org_code=org_code))
        if not rows:
            click.echo("no open dead letters")
        for r in rows:
            click.echo(f"{r.id:>8}  {r.org_code}  consent {r.consent_id:>10}  week {r.week_start}"
                       f"  attempts {r.attempts}  entered {r.entered_at:%Y-%m-%d %H:%M}  "
                       f"{r.last_error or ''}")
        return
    if not (org_code or ids or all_):
        raise click.UsageError("say which: --org ORG_CODE, --id N or --all (or --list)")
    res = with_engine(settings, lambda e: requeue(e, now=clock.now(), org_code=org_code,
                                                  ids=ids))
    for line in res.refused:
        click.echo(f"refused: {line}", err=True)
    if not res.requeued and not res.refused:
        click.echo("no open dead letters" + (f" of {org_code}" if org_code else "")
                   + "; nothing requeued")
        return
    click.echo(f"requeued {res.requeued} consent(s)"
               + (f", refused {len(res.refused)}" if res.refused else ""))
