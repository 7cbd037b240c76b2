"""Stopping background tasks for sure.

``task.cancel()`` asks once, and a library may absorb the request: on Python 3.11 a
cancellation that lands while an ``asyncio.timeout`` inside a client expires comes out as a
``TimeoutError``, which a retrying client (redis-py's default ``Retry``) then retries, and the
task goes on looping as if nothing was asked. One such task, awaited with a plain
``gather``, kept a cluster worker alive for ever after its day was done. ``cancel_and_wait``
asks again until the tasks end, and gives up loudly rather than hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import TypeVar

log = logging.getLogger("mydata.aio")


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]], *, every: float = 0.5,
                          tries: int = 20) -> bool:
    """Cancel ``tasks`` and wait until they end, cancelling again every ``every`` seconds
    (real time) at most ``tries`` times. True when all ended; False (and one warning naming
    the tasks) when some would not stop: they are left behind rather than waited on."""
    every_task = list(tasks)
    pending = {t for t in every_task if not t.done()}
    for _ in range(tries):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=every)
    for t in every_task:  # retrieved, so asyncio does not print "never retrieved"
        if t.done() and not t.cancelled():
            t.exception()
    if pending:
        log.warning("background tasks would not stop; left behind", extra={
            "action": "tasks_left", "tasks": sorted(t.get_name() for t in pending)})
        return False
    return True


_T = TypeVar("_T")


async def finish_first(aw: Awaitable[_T]) -> _T:
    """Await ``aw`` to its end even if the caller is cancelled meanwhile (however often),
    then raise the cancellation: for a database write that must commit or roll back before
    its task may stop.

    A cancellation that lands inside an aiosqlite ``executemany`` makes SQLAlchemy throw the
    connection away while the statement is still referenced by its cursor (held by the
    cancelled frames); SQLite then keeps the closed connection, its transaction and the
    file's write lock until that cursor is collected: every other write of the process
    waited its 30 s busy timeout and failed ("database is locked"). Seen when a run's end
    cancelled the minute export's upsert: the last minute rows and the run's summary were
    not stored."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])  # a cancellation of this wait leaves the task be
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what it gets
        raise asyncio.CancelledError
    return task.result()
