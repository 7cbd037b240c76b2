"""The circuit coordinator: one per cluster, elected through a Redis lease with fencing.

Every worker runs a :class:`Coordinator` candidate. Each tick (``coordinator_interval``) a
candidate that is not the leader tries to take the lease (``SET NX PX``, with a new
generation from ``INCR``); the leader reads the counts, the states and the overrides in one
round trip (server time included), decides every provider (batch/cluster/circuit.py) and
writes the states, its beat and the lease renewal in one fenced script: the script writes
only if the caller's "generation:candidate" token is still the lease's value, so a leader
that was paused past its lease (and maybe replaced) learns it has lost and writes nothing.
A dead leader's lease expires after ``lease_ttl``; the next tick of any candidate takes
over. The coordinator keeps no state of its own between ticks: everything it decides from
is in Redis, so a new leader continues exactly where the old one stopped.

Why Redis and not a PostgreSQL advisory lock: the circuit's state lives in Redis, so the
fence is checked by the same server, in the same script, as the write it guards (an
advisory lock lives on another server and cannot stop a stale leader's Redis write); the
lease expires on Redis's clock whatever happened to the leader's machine or TCP connection
(an advisory lock is released only when PostgreSQL notices the connection is gone); and if
Redis is down there is no cluster circuit to lead anyway, so one failure domain, not two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from batch.clock import Clock
from batch.cluster.circuit import CircuitSettings, ProviderCircuit, changed, decide
from batch.cluster.circuit_redis import CircuitStore, Snapshot
from batch.errors import describe

log = logging.getLogger("mydata.cluster")

#: what a transition is recorded with (e.g. a PostgreSQL row: batch/cluster/circuit_events.py)
TransitionSink = Callable[[Sequence[tuple[ProviderCircuit | None, ProviderCircuit]], str],
                          Awaitable[None]]


def decide_all(snap: Snapshot, *, settings: CircuitSettings, generation: int
               ) -> list[ProviderCircuit]:
    """Every provider that has a state, counts or an override, decided at the snapshot's
    server time."""
    orgs = set(snap.states) | set(snap.buckets) | set(snap.forced)
    return [decide(org, snap.states.get(org), snap.buckets.get(org, {}), now=snap.now,
                   forced=snap.forced.get(org), settings=settings, generation=generation)
            for org in sorted(orgs)]


class Coordinator:
    """One candidate for the coordinator's lease; the leader decides every provider."""

    def __init__(self, store: CircuitStore, *, candidate_id: str, clock: Clock,
                 on_transitions: TransitionSink | None = None) -> None:
        self.store = store
        self.candidate_id = candidate_id
        self.settings = store.settings
        self._clock = clock
        self._on_transitions = on_transitions
        self.token: str | None = None
        self.generation = 0
        self.ticks = 0
        self.failed_ticks = 0
        #: set after every tick (tests wait on it rather than sleeping)
        self.ticked = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.token is not None

    async def tick(self) -> bool:
        """One election attempt or decision round; True if this candidate led it."""
        if self.token is None:
            gen, token = await self.store.acquire(self.candidate_id)
            if gen:
                self.token, self.generation = token, gen
                log.warning("circuit coordinator elected", extra={
                    "action": "coordinator_elected", "worker_id": self.candidate_id,
                    "generation": gen})
            elif token.split(":", 1)[-1] == self.candidate_id:
                self.token = token  # our lease survived an error: still ours
                self.generation = int(token.split(":", 1)[0])
            else:
                return False
        snap = await self.store.read_snapshot()
        if snap.leader != self.token:
            self._lost("lease held by another" if snap.leader else "lease expired")
            return False
        new = decide_all(snap, settings=self.settings, generation=self.generation)
        if not await self.store.write(self.token, self.generation, new):
            self._lost("fenced: lease lost before the write")
            return False
        moves = [(snap.states.get(s.org_code), s) for s in new
                 if changed(snap.states.get(s.org_code), s)]
        for old, s in moves:
            log.warning("cluster circuit %s", s.state, extra={
                "action": f"cluster_circuit_{s.state}", "org_code": s.org_code,
                "reason": s.reason, "previous": str(old.state) if old else "closed",
                "generation": self.generation, "failure_rate": round(s.failure_rate, 4),
                "calls": s.calls})
        if moves and self._on_transitions is not None:
            try:
                await self._on_transitions(moves, self.candidate_id)
            except Exception as exc:  # recording is for operators; deciding goes on
                log.warning("circuit transitions not recorded", extra={
                    "action": "circuit_record_failed", "error": describe(exc)})
        return True

    def _lost(self, why: str) -> None:
        log.warning("circuit coordinator lost its lease", extra={
            "action": "coordinator_lost", "worker_id": self.candidate_id,
            "generation": self.generation, "reason": why})
        self.token = None

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop``; then give the lease up if this candidate holds it."""
        try:
            failing = 0  # ticks failed in a row: the first is logged, then the recovery
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception as exc:  # Redis down: try again next tick
                    failing += 1
                    self.failed_ticks += 1
                    if failing == 1:
                        log.warning("circuit coordinator tick failed; trying again every "
                                    "%.3g s", self.settings.coordinator_interval, extra={
                                        "action": "coordinator_tick_failed",
                                        "worker_id": self.candidate_id,
                                        "error": describe(exc)})
                else:
                    if failing:
                        log.warning("circuit coordinator ticks again", extra={
                            "action": "coordinator_tick_recovered",
                            "worker_id": self.candidate_id, "failed_ticks": failing})
                    failing = 0
                self.ticks += 1
                self.ticked.set()
                try:
                    async with self._clock.timeout(self.settings.coordinator_interval):
                        await stop.wait()
                except TimeoutError:
                    pass
        finally:
            await self.resign()

    async def resign(self) -> None:
        """Release the lease now (a clean stop), so another takes over at once."""
        token, self.token = self.token, None
        if token is not None:
            try:
                await self.store.release(token)
            except Exception as exc:
                log.warning("lease not released; it will expire", extra={
                    "action": "coordinator_release_failed", "error": describe(exc)})
