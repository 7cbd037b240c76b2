"""``mydata-batch demo``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from batch.cli import main, run_async
from batch.cli.options import clock_from_env
from batch.errors import ConfigError


@main.command("demo")
@click.option("--out", "out_dir", default="demo-out", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the SQLite file, the seed files and the dashboard go (reset each run).")
@click.option("--providers", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--consents", default=20_000, show_default=True, type=click.IntRange(1, 2_000_000))
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--window-minutes", default=2, show_default=True, type=click.IntRange(1, 60),
              help="Length of the run's window override (it starts at the next minute).")
def demo_cmd(out_dir: Path, providers: int, consents: int, seed: int,
             window_minutes: int) -> None:
    """Everything at once on a throw-away SQLite file (no arguments needed).

    \b
    1. seed providers, consents and usage history   4. run today's work in a short window
    2. start the provider simulator on 127.0.0.1    5. print the summary, write the dashboard
    3. plan the week                                6. stop the simulator and check its stats
    Ignores --db: the demo always uses OUT/demo.db. Tokens are encrypted with the key of
    MYDATA_TOKEN_KEYS / MYDATA_TOKEN_KEY_FILE, else with a new one in OUT/token.key.
    """
    from batch.demo import DemoSettings, demo_cipher, run_demo
    from batch.logs import setup_logging

    setup_logging(level="WARNING")
    try:
        settings = DemoSettings(out_dir=out_dir, providers=providers, consents=consents,
                                seed=seed, window_minutes=window_minutes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cipher, key_from = demo_cipher(out_dir)
    click.echo(f"== tokens encrypted in the database with key {cipher.primary_id} "
               f"(from {key_from})")
    code = run_async(run_demo(settings, clock=clock_from_env(), out=sys.stdout,
                              cipher=cipher))
    sys.exit(code)
