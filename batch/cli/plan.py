"""``mydata-batch plan``: the week's plan as a table, CSV or JSON; ``--save`` stores it."""

from __future__ import annotations

import json
from datetime import date, datetime, time
from typing import Any

import click

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env
from batch.db.loaders import usage_days
from batch.errors import ConfigError
from batch.plan_report import to_csv, to_records, to_table
from batch.planner import WeekPlan, build_week_plan, load_day_plan, save_plan, stale_reasons
from planning.calendar import KST, kst_date, week_days, week_start


def _parse_day(text: str | None, option: str) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a date like 2026-11-29", field=option) from None


def resolve_days(week: date | None, today: date | None, now: datetime) -> tuple[date, date]:
    """(week_of, today): the week defaults to now's; today to now's date if in the week,
    else the week's Sunday (a what-if of the whole week)."""
    now_day = kst_date(now)
    week_of = week or today or now_day
    days = week_days(week_of)
    if today is None:
        today = now_day if days[0] <= now_day <= days[-1] else days[0]
    elif not days[0] <= today <= days[-1]:
        raise ConfigError(f"{today} is not in the week {days[0]}..{days[-1]}", field="--today")
    return week_start(week_of), today


@main.command("plan")
@click.option("--week", "week_text", metavar="DATE", help="Any date in the week (default: "
              "this week, KST).")
@click.option("--today", "today_text", metavar="DATE", help="Plan from this day on; earlier "
              "days show what happened (default: today if in the week, else its Sunday).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--save/--dry-run", default=False, show_default=True,
              help="Store the plan for `run` (default: a dry run that writes nothing).")
@click.pass_obj
def plan_cmd(settings: Settings, week_text: str | None, today_text: str | None, fmt: str,
             save: bool) -> None:
    """Level the week's due consents per provider and day; show (and optionally save) it."""
    now = clock_from_env().now()
    week_of, today = resolve_days(_parse_day(week_text, "--week"),
                                  _parse_day(today_text, "--today"), now)
    if today != kst_date(now):
        # A what-if for another day: plan it as seen from its first minute.
        now = datetime.combine(today, time(0), tzinfo=KST)

    async def go(engine: Any) -> tuple[WeekPlan, tuple[str, ...],
                                      frozenset[tuple[str, date]]]:
        plan = await build_week_plan(engine, week_of=week_of, today=today, now=now)
        saved = await load_day_plan(engine, day=today)
        stale = (await stale_reasons(engine, saved, plan.limits, now=now)) if saved else ()
        if save:
            await save_plan(engine, plan)
        return plan, stale, await usage_days(engine, plan.week[0], plan.week[-1])

    plan, stale, actual = with_engine(settings, go)
    if stale:
        # the saved plan `run` would find: say it is stale, and what happens to it
        fate = "replaced by this one" if save else "`run` re-makes it (or `plan --save`)"
        click.echo(f"mydata-batch: the saved plan for {today} is stale "
                   f"({'; '.join(stale)}): {fate}", err=True)
    if fmt == "json":
        click.echo(json.dumps(to_records(plan), indent=None))
    elif fmt == "csv":
        click.echo(to_csv(plan), nl=False)
    else:
        click.echo(to_table(plan, saved=save, actual=actual))
    if plan.unplaceable():
        click.echo(f"mydata-batch: warning: {sum(plan.unplaceable().values()):,} consents "
                   "cannot be placed this week", err=True)
