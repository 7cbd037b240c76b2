"""Batched outcome writes: refreshes report here; one transaction per batch, never per call.

If the database is unreachable the batch stays in memory and is retried with backoff; the
dispatcher can ask whether the writer is healthy and stop claiming meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import date

from batch.clock import Clock
from batch.db.work import WorkStore
from batch.errors import describe
from batch.lifecycle import Change, TokenRefreshed

log = logging.getLogger("mydata.writer")


class OutcomeWriter:
    """Collects lifecycle changes (transitions, unsaved token pairs) and applies them every
    ``interval`` or ``max_batch``."""

    def __init__(
        self,
        store: WorkStore,
        *,
        run_id: str,
        worker: str,
        day: date,
        clock: Clock,
        interval: float = 0.5,
        max_batch: int = 2000,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._worker = worker
        self._day = day
        self._clock = clock
        self._interval = interval
        self._max_batch = max_batch
        self._buffer: list[Change] = []
        #: per provider, called with each consent id once its outcome is durably written
        self._watchers: dict[str, Callable[[int], None]] = {}
        self._wake = asyncio.Event()
        self._closing = False
        self._stopped = asyncio.Event()
        self._running = False
        self.written = 0
        self.failures = 0
        self.healthy = True
        self.last_error: str | None = None

    def watch(self, org_code: str, written: Callable[[int], None]) -> None:
        """Call ``written(consent_id)`` for each of ``org_code``'s outcomes once written."""
        self._watchers[org_code] = written

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def add(self, change: Change) -> None:
        self._buffer.append(change)
        if len(self._buffer) >= self._max_batch:
            self._wake.set()

    async def flush(self, *, drain: bool = False) -> bool:
        """Write what is buffered now (``drain``: until nothing is left, what arrives while
        writing included); False (and the batch kept) if the database failed.

        Without ``drain`` the outcomes that arrive during the write wait for the next one:
        under a steady stream a loop "while anything is buffered" never stops writing, and
        each round trip then carries only what came in during the previous one (1,200
        outcomes a second made 26 transactions a second instead of 2)."""
        left = len(self._buffer)
        while self._buffer and (drain or left > 0):
            batch = self._buffer[: self._max_batch if drain else min(left, self._max_batch)]
            left -= len(batch)
            try:
                await self._store.apply(batch, run_id=self._run_id, worker=self._worker,
                                        day=self._day)
            except Exception as exc:  # the DB being down must not lose outcomes
                self.failures += 1
                self.healthy = False
                self.last_error = describe(exc)
                log.warning("outcome write failed; will retry",
                            extra={"action": "write_failed", "error": self.last_error,
                                   "pending": len(self._buffer)})
                return False
            del self._buffer[: len(batch)]
            self.written += len(batch)
            self.healthy = True
            if self._watchers:
                for r in batch:
                    if isinstance(r, TokenRefreshed):
                        continue
                    g = r.log  # its ids as fields (the transition's are properties)
                    watcher = self._watchers.get(g.org_code)
                    if watcher is not None:
                        watcher(g.consent_id)
        return True

    async def run(self) -> None:
        """Flush periodically until :meth:`close`; back off while the database is down."""
        backoff = self._interval
        try:
            while not self._closing:
                try:
                    async with self._clock.timeout(backoff):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()
                if self._closing:
                    break
                ok = await self.flush()
                backoff = self._interval if ok else min(backoff * 2, 10.0)
        finally:
            self._stopped.set()

    def start(self) -> asyncio.Task[None]:
        """Run the periodic flush loop as a task; :meth:`close` ends it cleanly."""
        self._running = True
        return asyncio.create_task(self.run(), name="outcome-writer")

    async def close(self, *, timeout: float = 30.0) -> bool:
        """Stop the loop (after its current write: never cancelled mid-transaction), then
        write what is left, retrying up to ``timeout`` seconds."""
        self._closing = True
        self._wake.set()
        if self._running:
            await self._stopped.wait()
        deadline = self._clock.monotonic() + timeout
        delay = 0.2
        while True:
            if await self.flush(drain=True):
                return True
            if self._clock.monotonic() + delay > deadline:
                return False
            await self._clock.sleep(delay)
            delay = min(delay * 2, 5.0)
