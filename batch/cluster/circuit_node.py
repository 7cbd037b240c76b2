"""Everything one worker runs for the cluster circuit, behind one object.

    node = CircuitNode(redis, worker_id=..., clock=clock, live_workers=registry.live_workers)
    chain = ProviderChain(org, settings, clock=clock, listeners=(*obs, node.feed))
    gate = node.gate(chain, listeners=obs)      # the client's chain; gate.breaker_open
    await node.start(); ...; await node.stop()  # feed, view and coordinator candidate
    node.status()                               # for the run summary

Redis unreachable at any point is not an error here: the view says so (mode ``stale``, then
``local``) and the gates fall back to the local breakers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from redis.asyncio import Redis

from batch.aio import cancel_and_wait
from batch.clock import Clock
from batch.cluster.circuit import CircuitSettings
from batch.cluster.circuit_feed import OutcomeFeed
from batch.cluster.circuit_redis import DEFAULT_PREFIX, CircuitStore
from batch.cluster.circuit_view import CircuitView, LiveWorkers
from batch.cluster.coordinator import Coordinator, TransitionSink
from batch.cluster.probes import ClusterGate
from batch.resilience.chain import ProviderChain
from batch.resilience.events import Listener


class CircuitNode:
    """One worker's part of the cluster circuit: its feed, its view, its candidate."""

    def __init__(self, redis: Redis, *, worker_id: str, clock: Clock,
                 settings: CircuitSettings | None = None,
                 live_workers: LiveWorkers | None = None,
                 slow_call_duration: Mapping[str, float] | None = None,
                 on_transitions: TransitionSink | None = None,
                 candidate: bool = True, prefix: str = DEFAULT_PREFIX,
                 speed: float = 1.0) -> None:
        self.store = CircuitStore(redis, settings=settings or CircuitSettings(), prefix=prefix,
                                  speed=speed)
        self.worker_id = worker_id
        self._clock = clock
        self.feed = OutcomeFeed(self.store, clock=clock, slow_call_duration=slow_call_duration)
        self.view = CircuitView(self.store, worker_id=worker_id, clock=clock,
                                live_workers=live_workers)
        self.coordinator = (Coordinator(self.store, candidate_id=worker_id, clock=clock,
                                        on_transitions=on_transitions) if candidate else None)
        self.gates: dict[str, ClusterGate] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def gate(self, chain: ProviderChain, *, listeners: Sequence[Listener] = ()) -> ClusterGate:
        """The gate for ``chain`` (its probe twin reports to ``listeners`` and the feed)."""
        g = ClusterGate(chain, self.view, clock=self._clock,
                        listeners=(*listeners, self.feed))
        self.gates[chain.org_code] = g
        return g

    async def start(self) -> None:
        """One election attempt and one read of the list (so the first verdicts are the
        cluster's when there is one), then the feed, the view's refreshes and the
        coordinator candidate in the background."""
        self._stop.clear()
        if self.coordinator is not None:
            with contextlib.suppress(Exception):  # Redis down: the view says so
                await self.coordinator.tick()
        await self.view.refresh()
        self._tasks = [asyncio.create_task(self.feed.run(self._stop), name="circuit-feed"),
                       asyncio.create_task(self.view.run(self._stop), name="circuit-view")]
        if self.coordinator is not None:
            self._tasks.append(asyncio.create_task(self.coordinator.run(self._stop),
                                                   name="circuit-coordinator"))

    async def stop(self, *, grace: float = 2.0) -> None:
        """Stop the loops: a last push, and the coordinator's lease released if held. Loops
        still running after ``grace`` seconds (real time: Redis hanging) are cancelled."""
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            if pending:
                await cancel_and_wait(pending)
            for t in self._tasks:  # retrieved, so asyncio does not print "never retrieved"
                if t.done() and not t.cancelled():
                    t.exception()
        self._tasks = []

    def status(self) -> dict[str, object]:
        """For the run summary: the view's mode and list, and whether this node leads."""
        out = self.view.status()
        out["leader"] = bool(self.coordinator and self.coordinator.is_leader)
        out["probes_made"] = sum(g.probes_made for g in self.gates.values())
        out["refused"] = sum(g.refused for g in self.gates.values())
        out["counts_dropped"] = self.feed.dropped
        return out
