"""The bulkhead: at most N calls in flight per provider; a caller waits at most a set time.

A semaphore the caller's task waits on (no thread pool). The free path is two integer
operations; only a caller that must wait allocates a future. A permit freed while callers
wait goes straight to the first of them (FIFO), so no newcomer can overtake.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from batch.clock import Clock


class Bulkhead:
    __slots__ = ("_waiters", "in_use", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a permit if one is free and nobody is queued ahead."""
        if self.in_use < self.limit and not self._waiters:
            self.in_use += 1
            return True
        return False

    async def acquire(self, clock: Clock, max_wait: float) -> bool:
        """Wait up to ``max_wait`` seconds for a permit; False if none came in time."""
        if self.try_acquire():
            return True
        if max_wait <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with clock.timeout(max_wait):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # the permit arrived as the wait ran out: keep it
            self._drop(fut)
            return False
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a permit, but we are going away: pass it on
            else:
                self._drop(fut)
            raise
        return True

    def release(self) -> None:
        """Give a permit back, to the first live waiter if any (none while more are in use
        than a lowered limit allows)."""
        if self._waiters and self.in_use <= self.limit and self._wake_first():
            return  # the permit went straight to that waiter
        self.in_use -= 1

    def set_limit(self, limit: int) -> None:
        """A new limit (cluster mode: the provider's concurrency over the live workers).
        Raised, it lets waiters in at once; lowered, calls in flight finish and no new one
        starts until fewer than the limit are in use."""
        if limit < 1:
            raise ValueError("a bulkhead limit must be at least 1")
        self.limit = limit
        while self.in_use < limit and self._wake_first():
            self.in_use += 1

    def _wake_first(self) -> bool:
        """Hand a permit to the first waiter still waiting; False if there is none."""
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return True
        return False

    def _drop(self, fut: asyncio.Future[None]) -> None:
        fut.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)


def worker_share(max_concurrency: int, live: int, cap: int | None = None) -> int:
    """Calls one worker may have in flight to a provider: its share of the provider's
    ``max_concurrency`` over the ``live`` workers (at least 1), and never more than the
    worker's own ``cap`` (``run --concurrency``: what one machine is sized for). With the cap
    below the share, the provider's limit does not bind and each worker added brings its
    cap's worth of calls."""
    share = max(1, max_concurrency // max(1, live))
    return share if cap is None else max(1, min(share, cap))
