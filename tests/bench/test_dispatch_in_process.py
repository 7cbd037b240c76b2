"""Our cost a call without the network: a saturated ``run_day`` against (a3), both over one
in-process transport that answers at once.

Run: ``pytest -s tests/bench/test_dispatch_in_process.py`` (``INPROC_BENCH_ROUNDS``,
``INPROC_BENCH_BACKENDS``, ``INPROC_BENCH_PER_PROVIDER``). The dispatch benchmark's (b) row
against its (a3) swings by a tenth from one run to the next on this shared two-core machine:
the simulator shares the cores, and the kernel's socket work is in both. Here neither is:
``test_refresh_overhead.py``'s canned transport answers every list and detail call after
one turn of the loop, so what is left is this process's Python, and our part of it stands
out. Each round, taking turns:

(a3)   ``MydataClient.refresh`` over a pass-through chain, 200 refreshes in flight, 4 s:
       the dispatch benchmark's (a3), the floor of our HTTP layer;
(full) ``run_day`` over a one-minute plan of 4 providers, run at 3x speed (20 s), more
       offered than the loop can start: claims, start marks, the whole chain, the tokens
       opened, the outcomes written, the dispatcher's tasks, on a new database each round.

Printed: each round's CPU a call (``time.process_time`` over calls made; for (full) also the
loop's thread alone, ``time.thread_time``, and the rest: SQLite's driver thread, asyncpg has
none), the medians, ours = (full) - (a3) a call and the ratio (a3) / (full). Nothing about
the times is asserted; it is the instrument for a change of a few microseconds a call
(alternate it with the code before, e.g. from a ``git worktree``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest

from batch.client import make_http_client
from batch.config import Institutions, load_institutions
from tests.bench.profile_dispatch import saturated_day
from tests.bench.test_dispatch_throughput import _institutions_toml, client_loop, fresh_db
from tests.bench.test_refresh_overhead import Canned

__all__ = ["fresh_db"]  # the fixture, used below

ROUNDS = int(os.environ.get("INPROC_BENCH_ROUNDS", "3"))
BACKENDS = tuple(b for b in os.environ.get("INPROC_BENCH_BACKENDS",
                                           "sqlite,postgresql").split(",") if b)
#: refreshes planned per provider in the minute: more than the loop starts in it
PER_PROVIDER = int(os.environ.get("INPROC_BENCH_PER_PROVIDER", "60000"))
SPEED = 3.0
A3_SECONDS = 4.0
A3_CONCURRENCY = 200


def _a3(insts: Institutions) -> float:
    """(a3) for A3_SECONDS: CPU seconds a call."""
    c0 = time.process_time()
    calls, ok = asyncio.run(client_loop(insts, A3_CONCURRENCY, A3_SECONDS,
                                        transport=Canned()))
    assert ok == calls > 0, (ok, calls)
    return (time.process_time() - c0) / calls


def _full(url: str, insts_path: Path) -> tuple[float, float, int]:
    """(full) on a new database at ``url``: CPU seconds a call, the loop thread's, calls."""
    day = asyncio.run(saturated_day(
        url, insts_path, PER_PROVIDER, nullcontext(), speed=SPEED,
        http_factory=lambda n: make_http_client(transport=Canned())))
    assert day.calls > 0
    return day.cpu / day.calls, day.loop_cpu / day.calls, day.calls


@pytest.mark.timeout(1800)
def test_ours_a_call_in_process(tmp_path: Path, fresh_db: Callable[[str], str]) -> None:
    path = tmp_path / "institutions.toml"
    path.write_text(_institutions_toml([9] * 4))  # nothing listens: the transport answers
    insts = load_institutions(path)
    print(f"\n== in-process: (a3) and a saturated run_day over a canned transport, CPU us a "
          f"call, {ROUNDS} rounds taking turns ==")
    for backend in BACKENDS:
        a3: list[float] = []
        full: list[tuple[float, float, int]] = []
        for _ in range(ROUNDS):
            a3.append(_a3(insts))
            full.append(_full(fresh_db(backend), path))
        a3.append(_a3(insts))
        a3_us = 1e6 * statistics.median(a3)
        full_us = 1e6 * statistics.median(f[0] for f in full)
        main_us = 1e6 * statistics.median(f[1] for f in full)
        print(f"  {backend}:")
        print(f"    (a3)   {a3_us:6.1f} us a call  (rounds "
              f"{', '.join(f'{1e6 * x:.1f}' for x in a3)})")
        rounds = ", ".join(f"{1e6 * c:.1f} [loop {1e6 * m:.1f}, {n:,} calls]"
                           for c, m, n in full)
        print(f"    (full) {full_us:6.1f} us a call  (rounds {rounds})")
        print(f"    ours a call: {full_us - a3_us:.1f} us (the loop's thread "
              f"{main_us - a3_us:.1f}, other threads {full_us - main_us:.1f}); "
              f"(a3) / (full) = {a3_us / full_us:.2f}x")
