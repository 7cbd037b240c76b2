"""What SQLite's driver thread does in a saturated ``run_day``: each statement timed there.

Run: ``.venv/bin/python -m tests.bench.sqlite_statements`` (``PROFILE_RATE`` planned calls/s
offered over the one-minute plan, as ``profile_dispatch.py``; the simulator in its own
process, latency 0, one item per consent). aiosqlite runs every operation of a connection
in one thread of its own; each is wrapped here so that the thread's CPU time
(``time.thread_time``) is summed per statement (its first 90 characters) or per driver
method (commit, fetchall, close...), and the loop's wall time from handing it over to
having its answer (the queue, the GIL hand-off, the statement) is kept for every operation.
Printed: calls made, this process's CPU a call, the driver operations' wall p50/p99/max,
the thread's CPU a call in all and per statement, busiest first.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiosqlite.core

from batch.simulator import SimulatorProcess
from tests.bench.profile_dispatch import SCENARIO, saturated_day
from tests.bench.test_dispatch_throughput import CALLS_PER_REFRESH, PROVIDERS, _institutions_toml
from tests.integration.helpers import free_ports

#: per statement (or driver method): [operations, thread CPU seconds]
_THREAD: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
#: each operation's wall seconds, from the loop's side
_WALL: list[float] = []


def statement_key(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """What an operation is: its SQL's first 90 characters on one line, else the method."""
    if args and isinstance(args[0], str):
        return " ".join(args[0].split())[:90]
    return getattr(fn, "__name__", repr(fn))


def _instrument() -> None:
    run = aiosqlite.core.Connection._execute

    async def _execute(self: aiosqlite.Connection, fn: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
        key = statement_key(fn, args)

        def timed(*a: Any, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                row = _THREAD[key]
                row[0] += 1
                row[1] += time.thread_time() - t

        t0 = time.perf_counter()
        try:
            return await run(self, timed, *args, **kwargs)
        finally:
            _WALL.append(time.perf_counter() - t0)

    aiosqlite.core.Connection._execute = _execute  # type: ignore[method-assign]


@contextmanager
def _counting() -> Iterator[None]:
    """The run's operations only (not the database's making before it)."""
    _THREAD.clear()
    _WALL.clear()
    yield


def main() -> None:
    rate = float(os.environ.get("PROFILE_RATE", "3000"))
    top = int(os.environ.get("PROFILE_TOP", "15"))
    tmp = Path(tempfile.mkdtemp(prefix="mydata-sqlite-statements-"))
    path = tmp / "institutions.toml"
    path.write_text(_institutions_toml(free_ports(PROVIDERS)))
    scen = tmp / "scenario.toml"
    scen.write_text(SCENARIO)
    _instrument()
    with SimulatorProcess(path, scenario_path=scen, window_override=["0000:2359"]):
        _, calls, cpu, _ = asyncio.run(saturated_day(
            f"sqlite+aiosqlite:///{tmp / 'bench.db'}", path,
            int(rate * 60 / CALLS_PER_REFRESH / PROVIDERS), _counting()))
    calls = max(calls, 1)
    wall = sorted(_WALL) or [0.0]
    thread = sum(t for _, t in _THREAD.values())
    print(f"== SQLite's driver thread in a saturated run_day: {calls:,} calls, this process "
          f"{1e6 * cpu / calls:.0f} us of CPU a call ==")
    print(f"driver operations {len(_WALL):,}: wall p50 {1e3 * wall[len(wall) // 2]:.2f} ms, "
          f"p99 {1e3 * wall[int(len(wall) * 0.99)]:.1f} ms, max {1e3 * wall[-1]:.1f} ms")
    print(f"the thread's CPU: {1e6 * thread / calls:.1f} us a call in all")
    for key, (n, t) in sorted(_THREAD.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {1e6 * t / calls:6.2f} us a call  {int(n):6,} x {1e6 * t / max(n, 1):8.0f} us"
              f"  {key}")


if __name__ == "__main__":
    main()
