"""``mydata-batch revoke``: a user withdrew; the consent is never called again."""

from __future__ import annotations

from pathlib import Path

import click

from batch.cli import EXIT_USER_ERROR, Settings, main, with_engine
from batch.cli.options import clock_from_env


@main.command("revoke")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--id", "ids", type=int, multiple=True, help="A consent id (repeatable).")
@click.option("--ignore-extra-columns", "ignore_extra", is_flag=True,
              help="Skip FILE's columns other than user_id and org_code.")
@click.pass_obj
def revoke_cmd(settings: Settings, file: Path | None, ids: tuple[int, ...],
               ignore_extra: bool) -> None:
    """Revoke consents: never called again, their access and refresh tokens erased.

    \b
    By FILE.csv with a header row user_id,org_code (any order), by --id, or both:
      mydata-batch revoke withdrawn.csv
      mydata-batch revoke --id 1042 --id 1043
    All or nothing, in one transaction: an id or row that names no consent prints one line
    each, exits 2 and changes nothing. Revoking twice is harmless. A revoked consent comes
    back only if `load consents` brings it with a newer consented_at (a new consent).
    """
    from batch.db.revocation import read_revocations, revoke

    if file is None and not ids:
        raise click.UsageError("say which consents: FILE.csv (user_id,org_code) or --id N")
    rows = read_revocations(file, ignore_extra=ignore_extra) if file is not None else []
    now = clock_from_env().now()
    res = with_engine(settings, lambda e: revoke(e, now=now, ids=ids, rows=rows,
                                                 source=str(file)))
    if res.unknown:
        for line in res.unknown:
            click.echo(f"mydata-batch: error: {line}", err=True)
        click.echo(f"mydata-batch: error: nothing revoked ({len(res.unknown)} name no "
                   "consent)", err=True)
        raise SystemExit(EXIT_USER_ERROR)
    click.echo(f"revoked {res.revoked} consent(s), their tokens erased"
               + (f"; {res.already} were already revoked" if res.already else ""))
