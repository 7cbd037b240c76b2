"""SQLite statements against a busy event loop, with and without the GIL hand-off.

Run: ``pytest -s tests/bench/test_sqlite_handoff.py``. The store runs each SQLite transaction in its
own thread; while the event loop is busy (a saturated run), CPython 3.11 hands that thread
the GIL late or not at all (batch/db/handoff.py). A task burns the loop in 2 ms steps (a
saturated dispatcher's turns) while the store claims 700 consents (the busiest minute's
chunk) and writes 700 outcomes, once with the store's hand-off and once with it switched
off, side by side in one run; the idle loop's times beside them. Nothing is asserted about
the times (printed only).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import nullcontext
from datetime import date, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert

from batch.clock import KST
from batch.db import schema, work
from batch.db.engine import init_db, make_engine
from batch.lifecycle import Done, Refreshed
from tests.sealing import CIPHER

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=KST)
WEEK = date(2026, 11, 29)
ROWS = 700
ORG = "BANK000001"


async def _round(store: work.SqlWorkStore) -> tuple[float, float]:
    """Seconds to claim ROWS and to write their outcomes."""
    t0 = time.perf_counter()
    claims = await store.claim(ORG, worker="w", week=WEEK, now=NOW, limit=ROWS)
    t1 = time.perf_counter()
    await store.apply([Done(Refreshed(c.id, ORG, NOW, "success", "00000", None, 2, 5),
                            next_week=WEEK + timedelta(days=7)) for c in claims],
                      run_id="r", worker="w", day=NOW.date())
    return t1 - t0, time.perf_counter() - t1


async def _bench(path: Path) -> dict[str, tuple[float, float]]:
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    await init_db(engine)
    async with engine.begin() as conn:
        await conn.execute(insert(schema.institutions).values(
            org_code=ORG, industry="bank", base_url="http://127.0.0.1:9",
            windows='["0000:2400"]', calls_per_second=10, max_concurrency=2, updated_at=NOW))
        await conn.execute(insert(schema.consents), [
            {"id": i, "user_id": f"u{i}", "org_code": ORG, "access_token": "sealed",
             "consented_at": NOW, "due_week": WEEK, "not_before": NOW, "updated_at": NOW}
            for i in range(1, 6 * ROWS + 1)])
    busy = False

    async def burn() -> None:
        while True:
            if busy:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.002:
                    pass
            await asyncio.sleep(0)

    burner = asyncio.create_task(burn())
    out: dict[str, tuple[float, float]] = {}
    try:
        for name, on in (("idle loop", True), ("busy loop, hand-off", True),
                         ("busy loop, no hand-off", False)):
            store = work.SqlWorkStore(engine, CIPHER)
            if not on:
                store._handoff = nullcontext()  # type: ignore[assignment]
            busy = name.startswith("busy")
            out[name] = await asyncio.wait_for(_round(store), 300)
    finally:
        burner.cancel()
        await engine.dispose()
    return out


def test_sqlite_statements_against_a_busy_loop(tmp_path: Path) -> None:
    figures = asyncio.run(_bench(tmp_path / "handoff.db"))
    print(f"\n== SQLite, {ROWS} consents claimed then {ROWS} outcomes written, the loop busy "
          "in 2 ms steps (a saturated run) ==")
    print(f"{'':<26}{'claim ms':>10}{'write ms':>10}")
    for name, (claim, write) in figures.items():
        print(f"{name:<26}{claim * 1e3:>10.1f}{write * 1e3:>10.1f}")
