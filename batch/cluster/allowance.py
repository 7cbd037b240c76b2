"""One plan, shared: how many of a provider-minute's starts this worker may make now.

The dispatcher asks once per slice (batch/dispatch/provider.py's ``StartAllowance``). Each
worker asks for its share of the slice's new starts (the slice's count divided by the live
workers) plus what it was owed and not yet granted (at most a second's worth); Redis grants
at most the minute's cumulative target so far and the day's quota left, cluster-wide
(batch/cluster/scripts.py's GRANT). So N workers together start exactly the minute's target,
and a dead worker's share is taken up by the others as their carry grows (at once when the
registry sees the death: the share is divided by fewer workers).

Without Redis each worker grants itself its share of the minute's target (the target
divided by the live workers): the cluster still starts about the target, never N times it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

from batch.cluster.scripts import Scripts


class Link(Protocol):
    """What an allowance needs from the session: the live count and Redis's health."""

    def live(self) -> int: ...

    @property
    def shared(self) -> bool: ...

    def lost(self, exc: BaseException) -> None: ...


class SharedAllowance:
    """The dispatcher's StartAllowance in cluster mode, for one provider's day."""

    def __init__(self, org_code: str, *, scripts: Scripts, link: Link, day: str, quota: int,
                 seed: int, member: str = "",
                 timeout: Callable[[], float] | None = None) -> None:
        self.org_code = org_code
        self._scripts = scripts
        self._link = link
        self.day = day  # the provider's day (its Redis keys), as "YYYY-MM-DD"
        self._quota = quota
        self._seed = seed
        self._member = member  # this run, on the day's ledger of grants (a death gives back)
        self._pending = 0
        self._minute: int | None = None  # the minute of the last grant asked for
        self._local: dict[int, int] = {}  # minute -> granted locally (without Redis)
        #: the refund round trip in flight (at most one), and the starts it has still to send
        self._refunds: set[asyncio.Task[None]] = set()
        self._owed = 0
        self._sending = False
        self.granted = 0
        self.local_granted = 0

    async def take(self, minute: int, due: int, fresh: int, queued: int) -> int:
        """``due``: the minute's cumulative target up to this slice; ``fresh``: this slice's
        count; ``queued``: claims ready to start. Returns starts granted now."""
        live = max(1, self._link.live())
        self._minute = minute
        self._pending = min(self._pending + math.ceil(fresh / live), max(10 * fresh, 1))
        want = min(self._pending, queued)
        if want <= 0:
            return 0
        g = -1
        if self._link.shared:
            try:
                g = await self._scripts.grant(self.org_code, day=self.day, minute=minute,
                                              want=want, due=due, quota=self._quota,
                                              seed=self._seed, member=self._member)
            except Exception as exc:
                self._link.lost(exc)
                if self._link.shared:  # not lost (our own pool was full): none this slice
                    g = 0
        if g < 0:  # no Redis: our share of the minute's target
            used = self._local.get(minute, 0)
            g = max(0, min(want, math.ceil(due / live) - used))
            self._local[minute] = used + g
            self.local_granted += g
        self.granted += g
        self._pending -= g
        return g

    def refund(self, n: int) -> None:
        """Starts that never reached the provider: back to the day's quota. One round trip
        at a time per provider, carrying all given back meanwhile: a task per refund was a
        Redis connection each, and a slice's refused calls (over a hundred at once when a
        binding rate leaves a worker's waiters without permits) emptied the client's pool
        (redis-py's 100 connections): MaxConnectionsError, taken for Redis lost, and the
        worker ran on its local share beside the others' shared permits, above the rate."""
        if n <= 0 or not self._link.shared:
            return
        self._owed += n
        if self._sending:  # the round trip in flight sends this too when it is back
            return
        self._sending = True
        task = asyncio.get_running_loop().create_task(self._refund())
        self._refunds.add(task)
        task.add_done_callback(self._refunds.discard)

    async def _refund(self) -> None:
        try:
            while self._owed > 0 and self._link.shared:
                n, self._owed = self._owed, 0
                await self._scripts.refund(self.org_code, day=self.day, n=n,
                                           member=self._member, minute=self._minute)
        except Exception as exc:
            self._link.lost(exc)
        finally:
            self._sending = False
            self._owed = 0  # Redis lost: no day to give back to (the local share is kept)

    async def left(self) -> int | None:
        """The day's starts still to grant, cluster-wide (None without Redis): each worker
        paces its minutes on this, not on its own count, so all of them aim at the same
        minute targets (the last minute's "all that is left" included)."""
        if not self._link.shared:
            return None
        try:
            used = await self._scripts.day_used(self.org_code, day=self.day, seed=self._seed)
        except Exception as exc:
            self._link.lost(exc)
            return None
        return max(0, self._quota - used)
