"""What SQLite's threads do in a saturated ``run_day``: each statement timed there.

Run: ``.venv/bin/python -m tests.bench.sqlite_statements`` (``PROFILE_RATE`` planned calls/s
offered over the one-minute plan, as ``profile_dispatch.py``; the simulator in its own
process, latency 0, one item per consent). The store's transactions run whole in a thread
of this process (``batch.db.engine.run_transaction``), the engine's other statements
through aiosqlite, which runs every operation of a connection in one thread of its own.
Both are wrapped here so that the thread's CPU time (``time.thread_time``) is summed per
statement (its first 90 characters) or per driver method (commit, fetchall, close...), and
per store transaction, and the loop's wall time from handing each over to having its answer
(the queue, the GIL hand-off, the statements) is kept. Printed: calls made, this process's
CPU a call, those wall times' p50/p99/max, the store thread's CPU a call by transaction,
and the statements' CPU a call in all and per statement, busiest first.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiosqlite.core
from sqlalchemy import event
from sqlalchemy.engine import Engine

from batch.db import engine as engine_module
from batch.db import work
from tests.bench.profile_dispatch import simulated_run

#: per statement (or driver method): [operations, thread CPU seconds]
_THREAD: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
#: the store's transactions (run whole in its thread), by function: [transactions, CPU s]
_TRANSACTIONS: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
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


def _instrument_store_thread() -> None:
    """The store's transactions run whole in a thread of their own (``run_transaction``):
    each transaction's thread CPU by its function, each statement's between the cursor's
    execute events, and each transaction's wall time from the loop's side."""
    here = threading.local()  # the loop's statements (through aiosqlite) are timed there

    def before(*_: Any) -> None:
        if threading.current_thread().name.startswith("mydata-sqlite"):
            here.t = time.thread_time()

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        t = getattr(here, "t", None)
        here.t = None
        if t is not None:
            row = _THREAD[statement_key(statement, (statement,))]
            row[0] += 1
            row[1] += time.thread_time() - t

    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    whole = engine_module._in_transaction

    def timed(twin: Any, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return whole(twin, fn, args, kwargs)
        finally:
            row = _TRANSACTIONS[getattr(fn, "__name__", repr(fn))]
            row[0] += 1
            row[1] += time.thread_time() - t

    engine_module._in_transaction = timed  # type: ignore[assignment]
    run = work.run_transaction

    async def waited(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await run(*args, **kwargs)
        finally:
            _WALL.append(time.perf_counter() - t0)

    work.run_transaction = waited  # type: ignore[assignment]


@contextmanager
def _counting() -> Iterator[None]:
    """The run's operations only (not the database's making before it)."""
    _THREAD.clear()
    _TRANSACTIONS.clear()
    _WALL.clear()
    yield


def main() -> None:
    top = int(os.environ.get("PROFILE_TOP", "15"))
    _instrument()
    _instrument_store_thread()
    _, calls, cpu, _ = simulated_run("sqlite", "mydata-sqlite-statements-", _counting())
    calls = max(calls, 1)
    wall = sorted(_WALL) or [0.0]
    thread = sum(t for _, t in _THREAD.values())
    whole = sum(t for _, t in _TRANSACTIONS.values())
    print(f"== SQLite's threads in a saturated run_day: {calls:,} calls, this process "
          f"{1e6 * cpu / calls:.0f} us of CPU a call ==")
    print(f"the store's transactions and the driver's other operations {len(_WALL):,}, from "
          f"the loop's side: wall p50 {1e3 * wall[len(wall) // 2]:.2f} ms, "
          f"p99 {1e3 * wall[int(len(wall) * 0.99)]:.1f} ms, max {1e3 * wall[-1]:.1f} ms")
    print(f"the store's thread, whole transactions: {1e6 * whole / calls:.1f} us a call")
    for key, (n, t) in sorted(_TRANSACTIONS.items(), key=lambda kv: -kv[1][1]):
        print(f"  {1e6 * t / calls:6.2f} us a call  {int(n):6,} x {1e6 * t / max(n, 1):8.0f} us"
              f"  {key}")
    print(f"statements and driver operations, either thread: {1e6 * thread / calls:.1f} us a "
          "call in all")
    for key, (n, t) in sorted(_THREAD.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {1e6 * t / calls:6.2f} us a call  {int(n):6,} x {1e6 * t / max(n, 1):8.0f} us"
              f"  {key}")


if __name__ == "__main__":
    main()
