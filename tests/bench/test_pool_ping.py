"""What a PostgreSQL transaction costs the client with the pool's ping on every checkout
(SQLAlchemy's ``pool_pre_ping``) against the ping only after an idle spell (the product's:
``batch.db.engine._ping_when_idle``), side by side in one run.

Run: ``pytest -s tests/bench/test_pool_ping.py`` (``PING_BENCH_TX``, ``PING_BENCH_ROUNDS``).
Each round, taking turns on one new database (the tests' ``pg_url``): ``PING_BENCH_TX``
one-statement transactions (``SELECT 1``) one after another, then eight at a time.
asyncpg's ping is three round trips (BEGIN, an empty query, ROLLBACK) on top of the
transaction's own three (BEGIN, the statement, COMMIT). Printed: this process's CPU and
the wall time a transaction, the medians of the rounds and their ratio. Nothing about the
times is asserted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.db.engine import make_engine, transaction

TX = int(os.environ.get("PING_BENCH_TX", "2000"))
ROUNDS = int(os.environ.get("PING_BENCH_ROUNDS", "3"))
CONCURRENCY = (1, 8)


async def _round(engine: AsyncEngine, concurrency: int) -> tuple[float, float]:
    """CPU and wall microseconds a transaction."""
    async def one() -> None:
        async with transaction(engine) as conn:
            await conn.execute(text("SELECT 1"))

    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(TX // concurrency):
        await asyncio.gather(*(one() for _ in range(concurrency)))
    n = TX // concurrency * concurrency
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


async def _bench(url: str) -> dict[tuple[int, str], list[tuple[float, float]]]:
    engines = {"ping every checkout": make_engine(url, pool_pre_ping=True),
               "ping when idle": make_engine(url)}
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    try:
        for engine in engines.values():  # warm: the connections made
            await _round(engine, max(CONCURRENCY))
        for conc in CONCURRENCY:
            for _ in range(ROUNDS):
                for name, engine in engines.items():
                    out.setdefault((conc, name), []).append(await _round(engine, conc))
    finally:
        for engine in engines.values():
            await engine.dispose()
    return out


def test_pool_ping_cost_a_transaction(pg_url: str) -> None:
    out = asyncio.run(_bench(pg_url))
    print(f"\n== a one-statement PostgreSQL transaction, {TX:,} a round, {ROUNDS} rounds "
          "alternated (us a transaction: this process's CPU / wall) ==")
    for conc in CONCURRENCY:
        med = {}
        for (c, name), rounds in out.items():
            if c != conc:
                continue
            med[name] = (statistics.median(r[0] for r in rounds),
                         statistics.median(r[1] for r in rounds))
            each = "  ".join(f"{cpu:5.0f}/{wall:5.0f}" for cpu, wall in rounds)
            print(f"    {conc} at a time  {name:20} {each}   median {med[name][0]:5.0f} / "
                  f"{med[name][1]:5.0f}")
        every, idle = med["ping every checkout"], med["ping when idle"]
        print(f"    {conc} at a time  when idle / every checkout: CPU {idle[0] / every[0]:.2f}x, "
              f"wall {idle[1] / every[1]:.2f}x")
