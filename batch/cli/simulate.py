"""``mydata-batch simulate``: serve a simulated provider fleet until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import click

from batch.cli import main, run_async
from batch.cli.options import clock_from_env
from batch.config import load_institutions
from batch.errors import ConfigError
from planning.windows import Window, WindowError, parse_window


def _windows(values: tuple[str, ...]) -> tuple[Window, ...]:
    try:
        return tuple(parse_window(v, step=1) for v in values)
    except WindowError as exc:
        raise ConfigError(str(exc), field="--window-override") from None


def summary_lines(stats: dict[str, Any]) -> list[str]:
    """One line per provider and a total: calls, codes, violations, latency."""
    lines = []
    rows = [*stats["providers"].items(), ("total", stats["total"])]
    for org, s in rows:
        codes = " ".join(f"{c}={n}" for c, n in sorted(s["by_code"].items()))
        viol = " ".join(f"{k}={n}" for k, n in s["violations"].items() if n)
        lat = s["latency_ms"]
        lines.append(
            f"{org}: calls={s['calls']} transfers={s['transfers']} peak_1s={s['peak_1s']} "
            f"peak_100ms={s['peak_100ms']} peak_concurrency={s['peak_concurrency']} "
            f"p50={lat['p50']}ms p99={lat['p99']}ms codes[{codes}] violations[{viol or 'none'}]"
        )
    return lines


@main.command("simulate")
@click.option("--institutions", "institutions_path", required=True, metavar="FILE",
              type=click.Path(path_type=Path), help="Institutions TOML: who to serve where.")
@click.option("--scenario", "scenario_path", default=None, metavar="FILE",
              type=click.Path(path_type=Path),
              help="Scenario TOML/JSON: latency, faults, dead assets, outage timeline.")
@click.option("--window-override", "window_override", multiple=True, metavar="HHMM:HHMM",
              help="Replace every provider's windows (any minute; repeatable).")
@click.option("--seed", default=0, show_default=True, help="Seed for every random fate.")
def simulate(institutions_path: Path, scenario_path: Path | None,
             window_override: tuple[str, ...], seed: int) -> None:
    """Serve simulated MyData providers on 127.0.0.1 until SIGINT/SIGTERM.

    Prints one line per provider with its URL, and a stats summary on exit. Stats while it
    runs: GET <base_url>/_sim/stats; clear them: POST <base_url>/_sim/reset.
    """
    from batch.simulator import Simulator, load_scenario

    institutions = load_institutions(institutions_path)
    scenario = load_scenario(scenario_path) if scenario_path is not None else None
    windows = _windows(window_override)

    async def serve() -> dict[str, Any]:
        sim = Simulator(institutions, scenario, window_override=windows or None, seed=seed,
                        clock=clock_from_env())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with sim:
            for p in institutions.providers:
                click.echo(f"{p.org_code} {p.industry} {p.base_url}")
            click.echo(f"serving {len(institutions.providers)} provider(s); Ctrl-C to stop")
            sys.stdout.flush()
            await stop.wait()
        return sim.stats()

    stats = run_async(serve())
    for line in summary_lines(stats):
        click.echo(line)
