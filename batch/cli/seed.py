"""``mydata-batch seed``: write and load a deterministic synthetic population."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.cli import Settings, main, with_engine
from batch.cli.options import clock_from_env, token_cipher
from batch.db.engine import init_db, redact
from batch.db.loaders import count_consents
from batch.errors import ConfigError, InputError
from batch.seed import SeedParams, SeedResult, load_seed, load_time, write_seed


def _summary(result: SeedResult, counts: tuple[int, int, int], seconds: float,
             db: str) -> str:
    lines = [f"{'org_code':<11} {'industry':<8} {'cps':>4} {'conc':>4} {'consents':>9} "
             f"{'due':>8} {'new':>6} {'backlog':>7}  windows"]
    for p in result.providers:
        lines.append(f"{p.org_code:<11} {p.industry:<8} {p.calls_per_second:>4} "
                     f"{p.max_concurrency:>4} {p.consents:>9} {p.due_this_week:>8} "
                     f"{p.never_fetched:>6} {p.backlog:>7}  {','.join(p.windows)}")
    n_inst, n_cons, n_usage = counts
    lines.append(
        f"seeded {n_inst} providers, {n_cons} consents "
        f"({sum(p.due_this_week for p in result.providers)} due this week), {n_usage} usage "
        f"rows {result.first_usage_day}..{result.last_usage_day} into {db} in {seconds:.1f}s; "
        f"files in {result.files.institutions.parent}")
    return "\n".join(lines)


@main.command("seed")
@click.option("--providers", default=5, show_default=True, type=click.IntRange(1, 999_999),
              help="How many providers (industries cycle bank, card, invest, insu, capital...).")
@click.option("--consents", default=20_000, show_default=True, type=click.IntRange(0),
              help="How many consents, spread unevenly over the providers.")
@click.option("--weeks", default=8, show_default=True, type=click.IntRange(1, 520),
              help="Weeks of daily user-call history, up to yesterday.")
@click.option("--seed", "seed", default=42, show_default=True, type=int,
              help="Random seed: the same seed and --today write identical files.")
@click.option("--today", type=click.DateTime(formats=["%Y-%m-%d"]), default=None,
              help="The KST date the population is as of (default: today).")
@click.option("--base-port", default=19001, show_default=True, type=click.IntRange(1, 65535),
              help="Provider i gets base_url http://127.0.0.1:(base-port + i), for `simulate`.")
@click.option("--out", "out_dir", default="seed-out", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for institutions.toml, consents.csv and usage.csv.")
@click.option("--force", is_flag=True,
              help="Write into a database that already holds consents (they are kept; the "
                   "seed's providers replace the others, which are retired).")
@click.pass_obj
def seed_cmd(settings: Settings, providers: int, consents: int, weeks: int, seed: int,
             today: datetime | None, base_port: int, out_dir: Path, force: bool) -> None:
    """Write a synthetic population to --out and load it into the database.

    \b
    Providers of several industries with realistic windows and limits; consents mostly
    due this week (some new, a small backlog, some already done this week); daily user
    calls with weekday, payday (21st-25th) and month-end effects. The files go through
    the same checks as `load`, so they double as examples of the formats. A database that
    already holds consents is refused unless --force. The tokens are stored encrypted
    (MYDATA_TOKEN_KEYS or MYDATA_TOKEN_KEY_FILE); the CSV in --out holds them plain.
    """
    cipher = token_cipher()  # before any file is written
    clock = clock_from_env()
    day = today.date() if today is not None else clock.now().date()
    try:
        params = SeedParams(today=day, providers=providers, consents=consents, weeks=weeks,
                            seed=seed, base_port=base_port)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    started = time.perf_counter()
    try:
        result = write_seed(params, out_dir)
    except OSError as exc:
        raise InputError(f"cannot write the seed files: {exc.strerror or exc}",
                         file=str(out_dir)) from None

    async def go(engine: AsyncEngine) -> tuple[int, int, int]:
        await init_db(engine)
        held = await count_consents(engine)
        if held and not force:
            raise InputError(f"the database {redact(settings.db_url)} already holds {held} "
                             "consents; seed a new database (--db), or pass --force to add "
                             "the synthetic population to them")
        return await load_seed(engine, result.files, now=load_time(day, clock.now()),
                               cipher=cipher, replace=force)

    counts = with_engine(settings, go)
    click.echo(_summary(result, counts, time.perf_counter() - started, redact(settings.db_url)))
