"""What a saturated ``run_day`` on PostgreSQL sends its server, and what sending costs the loop.

Run: ``.venv/bin/python -m tests.bench.pg_writes`` (``PROFILE_RATE`` planned calls/s offered
over the one-minute plan, as ``profile_dispatch.py``; the simulator in its own process,
latency 0, one item per consent; a database made and dropped on the test server,
``MYDATA_TEST_PG_URL``). Counted over the run alone (not the database's making before it):

- every statement the store sends (SQLAlchemy's ``before_cursor_execute``), by its first 90
  characters: how many, and the bytes of its text and parameters (a string or bytes value
  its length, any other value 8);
- every write of the event loop's socket transports (asyncio's
  ``_SelectorSocketTransport.write``), by the protocol's package (asyncpg's to the server,
  aiohttp's to the providers): how many, their bytes, and for each the wall time and the
  loop thread's CPU time (``time.thread_time``) it took. A write whose wall time is far
  above its CPU time is the loop's thread off its core while it sends: py-spy, which
  samples the thread's stack whether it runs or waits for its core, books that wait to the
  line that writes.

2026-12-07 (eleventh session, 3,000 calls/s offered): asyncpg 1,530 writes of 6.3 kB on
average, 420 us of wall each and 43 us of the thread's CPU; aiohttp's 180,000 writes 9.7
and 10.0 us; the statements 52 bytes a call in all.
"""

from __future__ import annotations

import asyncio.selector_events as selector_events
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from tests.bench.profile_dispatch import simulated_run
from tests.bench.sqlite_statements import statement_key

#: per statement: [statements, bytes]
_SENT: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
#: per protocol package: [writes, bytes, wall seconds, thread CPU seconds, longest wall]
_WRITES: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0])


def _size(value: Any) -> int:
    """The bytes a parameter carries, about (containers summed, a scalar 8)."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_size(v) for v in value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    return 8


def _instrument() -> None:
    def before(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        row = _SENT[statement_key(statement, (statement,))]
        row[0] += 1
        row[1] += len(statement) + _size(parameters)

    event.listen(Engine, "before_cursor_execute", before)
    write = selector_events._SelectorSocketTransport.write

    def timed(self: Any, data: Any) -> None:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            write(self, data)
        finally:
            wall = time.perf_counter() - w0
            row = _WRITES[type(self._protocol).__module__.split(".")[0]]
            row[0] += 1
            row[1] += len(data)
            row[2] += wall
            row[3] += time.thread_time() - c0
            row[4] = max(row[4], wall)

    selector_events._SelectorSocketTransport.write = timed  # type: ignore[method-assign]


@contextmanager
def _counting() -> Iterator[None]:
    """The run's statements and writes only (not the database's making before it)."""
    _SENT.clear()
    _WRITES.clear()
    yield


def main() -> None:
    top = int(os.environ.get("PROFILE_TOP", "12"))
    _instrument()
    seconds, calls, cpu, _ = simulated_run("postgresql", "mydata-pg-writes-", _counting())
    calls = max(calls, 1)
    print(f"== what a saturated run_day on PostgreSQL sends: {calls:,} calls in {seconds:.1f} s, "
          f"this process {1e6 * cpu / calls:.0f} us of CPU a call ==")
    print("socket writes of the loop's transports, by protocol:")
    for key, (n, size, wall, thread, longest) in sorted(_WRITES.items()):
        n = max(int(n), 1)
        print(f"  {key:10} {n:9,} writes {size / n:9,.0f} B each | wall {1e6 * wall / n:7.1f} us "
              f"each, {wall:6.3f} s in all ({1e6 * wall / calls:5.2f} us a call), longest "
              f"{1e3 * longest:.2f} ms | the loop thread's CPU {1e6 * thread / n:7.1f} us each "
              f"({1e6 * thread / calls:5.2f} us a call)")
    sent = sum(b for _, b in _SENT.values())
    print(f"statements: {sum(n for n, _ in _SENT.values()):,}, {sent:,} bytes "
          f"({sent / calls:.0f} a call); busiest first:")
    for key, (n, size) in sorted(_SENT.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {n:7,} x {size / max(n, 1):9,.0f} B = {size:11,} B  {key}")


if __name__ == "__main__":
    main()
