"""The gate in front of one provider's chain in cluster mode, and its probe calls.

:class:`ClusterGate` is what the client calls instead of the chain (it has the chain's
``call``). While the cached cluster list has the provider closed, or while the worker is
on its local breakers only (no usable list), every call goes to the provider's chain
unchanged. While it is open, a call is refused at once (``rejected(BREAKER)``: neutral, the
consent stays due) unless this worker is a designated probe worker and wins a probe
reservation in Redis (at most ``probe_rate`` a second, the whole cluster together); a probe
goes through a twin chain whose breaker is disabled and which never retries, so one
reservation is one call, and the probe workers' local breakers (whose OPEN waits grow on
each re-trip) cannot starve the cluster of the samples it needs to close. Forced open:
no probes at all.

:meth:`ClusterGate.breaker_open` is the dispatcher's predicate (``breaker_open=``): the
cluster verdict combined with the local breaker. While the worker follows a fresh cluster
list (mode CLUSTER) its local breaker is METRICS_ONLY: it keeps its rates but never trips,
because the cluster decides (a local breaker that trips on its first five failures would
starve the cluster of the samples that show the outage, and its OPEN waits, grown during the
outage, would keep the worker off long after the cluster closed). As soon as the list is
not fresh (STALE: Redis or the coordinator lost) the local breaker is armed again (reset to
CLOSED), so a provider that fails from then on is stopped locally: never no protection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from batch.clock import Clock
from batch.cluster.circuit import CircuitState, ProbePacer, ViewMode
from batch.cluster.circuit_view import CircuitView
from batch.resilience.breaker import State
from batch.resilience.chain import ProviderChain
from batch.resilience.events import Emitter, Listener, Rejected
from batch.resilience.outcomes import Layer, Outcome, rejected

log = logging.getLogger("mydata.cluster")

_REJ_OPEN = rejected(Layer.BREAKER, "cluster circuit open")
_REJ_FORCED = rejected(Layer.BREAKER, "cluster circuit forced open")


def probe_chain(chain: ProviderChain, *, clock: Clock,
                listeners: Sequence[Listener] = ()) -> ProviderChain:
    """The twin chain probes go through: same limits and timeouts, no retries, breaker off."""
    s = chain.settings
    twin = ProviderChain(chain.org_code, replace(s, retry=replace(s.retry, max_attempts=1)),
                         clock=clock, listeners=listeners)
    twin.breaker.disable()
    return twin


class ClusterGate:
    """One provider's chain behind the cluster circuit (a ``CallChain`` for the client)."""

    def __init__(self, chain: ProviderChain, view: CircuitView, *, clock: Clock,
                 listeners: Sequence[Listener] = ()) -> None:
        self.org_code = chain.org_code
        self.chain = chain
        self.probes = probe_chain(chain, clock=clock, listeners=listeners)
        self._view = view
        self._clock = clock
        # as the chain tells its own refusals (a recorder's sink bound to the provider)
        self._emit = Emitter(listeners, org_code=self.org_code)
        self._pacer = ProbePacer(view.settings.probe_interval)
        #: at most one reservation asked of Redis per probe interval from this worker: the
        #: calls of refreshes already under way when the provider opened are refused here,
        #: not each with a round trip (hundreds at once would empty the connection pool)
        self._asks = ProbePacer(view.settings.probe_interval)
        self.refused = 0
        self.probes_made = 0
        view.on_mode(self._on_mode)
        if view.mode() is ViewMode.CLUSTER:
            self._on_mode(ViewMode.LOCAL, ViewMode.CLUSTER)

    async def call(self, attempt: Callable[[float], Awaitable[Outcome]], *,
                   deadline: float | None = None) -> Outcome:
        state = self._view.state(self.org_code)
        if state is None or not state.is_open:
            return await self.chain.call(attempt, deadline=deadline)
        if state is CircuitState.FORCED_OPEN:
            return self._refuse(_REJ_FORCED)
        if (not self._view.is_probe_worker
                or not self._asks.take(self._clock.monotonic())
                or not await self._view.reserve_probe(self.org_code)):
            return self._refuse(_REJ_OPEN)
        self.probes_made += 1
        return await self.probes.call(attempt, deadline=deadline)

    def _refuse(self, out: Outcome) -> Outcome:
        self.refused += 1
        if self._emit.active:
            self._emit(Rejected(self.org_code, Layer.BREAKER, out.detail))
        if self._emit.ends:
            self._emit.ended(self.org_code, None, out, 0, 0.0)
        return out

    def breaker_open(self) -> bool:
        """For the dispatcher: no refresh starts (they would be refused at once)."""
        state = self._view.state(self.org_code)
        if state is not None and state.is_open:
            if state is CircuitState.OPEN and self._view.is_probe_worker:
                return not self._pacer.take(self._clock.monotonic())
            return True
        return self.chain.breaker.is_open

    def breaker_state(self) -> str:
        """The state the run summary shows: the cluster's when it decides (``cluster_closed``,
        not the local breaker's ``metrics_only``), else the local."""
        state = self._view.state(self.org_code)
        if state is not None:
            return f"cluster_{state}"
        return str(self.chain.breaker.state.value)

    def _on_mode(self, old: ViewMode, new: ViewMode) -> None:
        b = self.chain.breaker
        if new is ViewMode.CLUSTER:
            if b.state in (State.CLOSED, State.OPEN, State.HALF_OPEN):
                b.metrics_only()
        elif old is ViewMode.CLUSTER and b.state is State.METRICS_ONLY:
            log.warning("cluster list not fresh: local breaker armed", extra={
                "action": "local_breaker_armed", "org_code": self.org_code,
                "mode": str(new)})
            b.reset()
