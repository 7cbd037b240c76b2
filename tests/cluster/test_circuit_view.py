"""A worker's view and gate on a FakeClock with a fake store: the fallback timing (fresh,
kept for a bounded time, then local), the gate's refusals and probes, and the local
breaker metrics-only while the cluster decides, armed again when it cannot."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import cast

import pytest

from batch.clock import FakeClock
from batch.cluster.circuit import CircuitSettings, CircuitState, Forced, ProviderCircuit, ViewMode
from batch.cluster.circuit_redis import CircuitStore, WorkerView
from batch.cluster.circuit_view import CircuitView
from batch.cluster.probes import ClusterGate
from batch.resilience.breaker import State
from batch.resilience.chain import ProviderChain
from batch.resilience.events import CallFinished, Event, Rejected
from batch.resilience.outcomes import Kind, Layer, Outcome, connection_error
from batch.resilience.settings import ChainSettings

S = CircuitSettings(keep_last_for=60, coordinator_stale_after=15, refresh_interval=10,
                    probe_rate=1.0)
ORG = "BANK000001"


@dataclass
class FakeStore:
    settings: CircuitSettings = S
    states: dict[str, ProviderCircuit] = field(default_factory=dict)
    forced: dict[str, Forced] = field(default_factory=dict)
    server_now: float = 1000.0
    beat_age: float | None = 0.5
    down: bool = False
    reservations: list[bool] = field(default_factory=list)

    async def read_view(self) -> WorkerView:
        if self.down:
            raise ConnectionError("Connection refused")
        beat = None if self.beat_age is None else self.server_now - self.beat_age
        return WorkerView(self.server_now, dict(self.states), dict(self.forced), beat, "1:w1")

    async def reserve_probe(self, org_code: str, worker_id: str) -> bool:
        return self.reservations.pop(0) if self.reservations else False


def open_state() -> ProviderCircuit:
    return ProviderCircuit(ORG, CircuitState.OPEN, 990.0, "failure rate 90%")


def make(probe: bool = False) -> tuple[FakeClock, FakeStore, CircuitView]:
    clock = FakeClock()
    store = FakeStore()

    async def live() -> list[str]:
        return ["w1", "w2", "w3"]

    view = CircuitView(cast(CircuitStore, store), worker_id="w1" if probe else "w2",
                       clock=clock, live_workers=live)
    return clock, store, view


async def test_fresh_then_kept_for_a_bounded_time_then_local(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mydata.cluster")
    clock, store, view = make()
    assert view.mode() is ViewMode.LOCAL and view.state(ORG) is None  # nothing read yet
    store.states[ORG] = open_state()
    assert await view.refresh() is ViewMode.CLUSTER
    assert view.is_open(ORG)
    store.down = True
    clock.advance(10)
    assert await view.refresh() is ViewMode.STALE
    assert view.is_open(ORG)  # the last list is kept
    assert view.status()["last_error"] == "ConnectionError: Connection refused"
    clock.advance(50)  # 60 s after the last fresh read: still kept
    assert view.mode() is ViewMode.STALE
    clock.advance(0.5)
    assert view.mode() is ViewMode.LOCAL  # between refreshes too: the verdict is timed
    assert view.state(ORG) is None and not view.is_open(ORG)
    await view.refresh()
    modes = [r.mode for r in caplog.records if getattr(r, "action", "") == "circuit_mode"]
    assert modes == ["cluster", "stale", "local"]
    assert view.status()["mode"] == "local"
    store.down = False
    assert await view.refresh() is ViewMode.CLUSTER
    # the summary says the view left the cluster's list once, and which modes it was in
    st = view.status()
    assert st["left_cluster"] == 1 and st["modes_seen"] == ["cluster", "local", "stale"]


async def test_a_stale_coordinator_beat_is_not_a_fresh_list() -> None:
    clock, store, view = make()
    store.states[ORG] = open_state()
    await view.refresh()
    store.beat_age = 16  # the coordinator stopped writing 16 s ago (server clock)
    clock.advance(10)
    assert await view.refresh() is ViewMode.STALE
    assert view.status()["last_error"] == "coordinator beat missing or stale"
    store.beat_age = None
    clock.advance(51)
    assert await view.refresh() is ViewMode.LOCAL


async def test_forced_open_applies_to_a_kept_list_without_a_coordinator() -> None:
    _, store, view = make()
    await view.refresh()
    store.beat_age = None
    store.forced[ORG] = Forced(CircuitState.FORCED_OPEN, "maintenance", 1000.0, "kim")
    await view.refresh()
    assert view.state(ORG) is CircuitState.FORCED_OPEN


def chain(clock: FakeClock) -> ProviderChain:
    return ProviderChain(ORG, ChainSettings(), clock=clock)


async def test_gate_refuses_an_open_provider_without_a_call_unless_probing() -> None:
    clock, store, view = make(probe=False)
    c = chain(clock)
    gate = ClusterGate(c, view, clock=clock)
    calls: list[float] = []

    async def attempt(t: float) -> Outcome:
        calls.append(t)
        return Outcome(Kind.SUCCESS, "00000", 200)

    await view.refresh()
    assert c.breaker.state is State.METRICS_ONLY  # the cluster decides
    assert gate.breaker_state() == "cluster_closed"  # the summary's column: not metrics_only
    assert (await gate.call(attempt)).ok
    store.states[ORG] = open_state()
    await view.refresh()
    out = await gate.call(attempt)
    assert (out.kind, out.layer, out.detail) == (Kind.REJECTED, Layer.BREAKER,
                                                 "cluster circuit open")
    assert len(calls) == 1
    assert gate.breaker_open()
    assert gate.breaker_state() == "cluster_open"


async def test_a_refusal_is_told_to_each_listener_as_the_chain_tells_its_own() -> None:
    class CallEnds:
        hears = frozenset({CallFinished})

        def __init__(self) -> None:
            self.got: list[Event] = []

        def __call__(self, event: Event) -> None:
            self.got.append(event)

    clock, store, view = make(probe=False)
    every: list[Event] = []
    ends = CallEnds()
    gate = ClusterGate(chain(clock), view, clock=clock, listeners=[every.append, ends])
    store.states[ORG] = open_state()
    await view.refresh()

    async def attempt(t: float) -> Outcome:
        raise AssertionError("an open provider is not called")

    before = len(every)  # the probe chain's breaker, switched off, told its own change
    out = await gate.call(attempt)
    told = every[before:]
    assert [type(e) for e in told] == [Rejected, CallFinished]
    assert told[1].outcome is out  # type: ignore[union-attr]
    assert ends.got == told[1:]  # a listener hears only what it names


async def test_probe_worker_calls_once_per_reservation_and_never_retries() -> None:
    clock, store, view = make(probe=True)
    gate = ClusterGate(chain(clock), view, clock=clock)
    store.states[ORG] = open_state()
    await view.refresh()
    assert view.is_probe_worker
    calls = 0

    async def attempt(t: float) -> Outcome:
        nonlocal calls
        calls += 1
        return connection_error("refused")  # retryable: the main chain would retry it

    store.reservations = [True, False]
    assert (await gate.call(attempt)).kind is Kind.FAULT
    assert calls == 1
    assert (await gate.call(attempt)).kind is Kind.REJECTED  # no reservation: refused
    assert calls == 1
    assert gate.probes_made == 1
    # the dispatcher starts a probe refresh at most once per probe interval
    assert [gate.breaker_open() for _ in range(3)] == [False, True, True]
    clock.advance(1.0)
    assert not gate.breaker_open()


async def test_probe_worker_asks_redis_once_per_probe_interval_not_per_call() -> None:
    # 200 calls of refreshes under way when the provider opened: one reservation asked,
    # not 200 round trips at once (they emptied the worker's Redis connection pool)
    clock, store, view = make(probe=True)
    gate = ClusterGate(chain(clock), view, clock=clock)
    store.states[ORG] = open_state()
    await view.refresh()
    store.reservations = [False] * 300

    async def attempt(t: float) -> Outcome:
        raise AssertionError("no reservation was granted")

    outs = [await gate.call(attempt) for _ in range(200)]
    assert {o.detail for o in outs} == {"cluster circuit open"}
    assert len(store.reservations) == 299
    clock.advance(1.0)  # the next probe interval: one more ask
    await gate.call(attempt)
    assert len(store.reservations) == 298


async def test_forced_open_is_not_probed() -> None:
    clock, store, view = make(probe=True)
    gate = ClusterGate(chain(clock), view, clock=clock)
    store.forced[ORG] = Forced(CircuitState.FORCED_OPEN, "maintenance", 1000.0)
    await view.refresh()
    store.reservations = [True]

    async def attempt(t: float) -> Outcome:
        raise AssertionError("no call while forced open")

    assert (await gate.call(attempt)).detail == "cluster circuit forced open"
    assert gate.breaker_open()


async def test_local_breaker_armed_again_when_the_list_is_not_fresh() -> None:
    clock, store, view = make()
    c = chain(clock)
    gate = ClusterGate(c, view, clock=clock)
    await view.refresh()
    assert c.breaker.state is State.METRICS_ONLY
    store.down = True
    await view.refresh()
    assert c.breaker.state is State.CLOSED  # judging again: protection stays
    c.breaker.force_open()  # the local breaker decides now
    assert gate.breaker_open()
    store.down = False
    await view.refresh()
    assert c.breaker.state is State.FORCED_OPEN  # an operator's manual state is kept
