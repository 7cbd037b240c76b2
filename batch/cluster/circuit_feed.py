"""A chain listener that counts each provider's calls and pushes the counts to Redis.

Attach :class:`OutcomeFeed` to every chain (``ProviderChain(listeners=...)``): each
``CallFinished`` adds a success, a failure and/or a slow call (neutral outcomes add
nothing, as for the local breaker). :meth:`OutcomeFeed.push` sends every provider's counts
in one script call, stamped with the server's clock. Counts that could not be pushed are
dropped, not kept for later: pushed late they would land in a later bucket and misstate
that moment's rates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from batch.clock import Clock
from batch.cluster.circuit import Counts, count_of
from batch.cluster.circuit_redis import CircuitStore
from batch.errors import describe
from batch.resilience.events import CallFinished, Event

log = logging.getLogger("mydata.cluster")


class OutcomeFeed:
    """Counts per provider since the last push; a ``Listener`` for the chain."""

    #: it counts calls: the other events never reach it
    hears = frozenset({CallFinished})

    def __init__(self, store: CircuitStore, *, clock: Clock,
                 slow_call_duration: Mapping[str, float] | None = None) -> None:
        self.store = store
        self._clock = clock
        self._slow = dict(slow_call_duration or {})
        self._default_slow = store.settings.slow_call_duration
        self._pending: dict[str, list[int]] = {}
        self.pushed = 0
        self.dropped = 0
        self._failing = False

    def __call__(self, event: Event, /) -> None:
        if type(event) is not CallFinished:
            return
        c = count_of(event, self._slow.get(event.org_code, self._default_slow))
        if c is None:
            return
        acc = self._pending.get(event.org_code)
        if acc is None:
            acc = self._pending[event.org_code] = [0, 0, 0]
        acc[0] += c.successes
        acc[1] += c.failures
        acc[2] += c.slow

    def take(self) -> dict[str, Counts]:
        """The counts gathered since the last take, cleared."""
        out = {org: Counts(*acc) for org, acc in self._pending.items() if any(acc)}
        self._pending = {}
        return out

    async def push(self) -> bool:
        """One round trip with everything gathered; False (counts dropped) if it failed."""
        counts = self.take()
        if not counts:
            return True
        try:
            await self.store.push(counts)
        except Exception as exc:
            self.dropped += sum(c.calls for c in counts.values())
            if not self._failing:
                log.warning("circuit counts not pushed; dropped until Redis is back", extra={
                    "action": "circuit_push_failed", "error": describe(exc)})
            self._failing = True
            return False
        if self._failing:
            log.info("circuit counts pushed again", extra={"action": "circuit_push_restored"})
        self._failing = False
        self.pushed += sum(c.calls for c in counts.values())
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Push every ``push_interval`` until ``stop``, and once more at the end."""
        interval = self.store.settings.push_interval
        while not stop.is_set():
            try:
                async with self._clock.timeout(interval):
                    await stop.wait()
            except TimeoutError:
                pass
            await self.push()
