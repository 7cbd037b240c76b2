"""The breaker as every provider gets it by default (``ChainSettings.from_provider``), on the
fake clock: an outage stops the calls within about 10 s whatever the call rate, and a
provider slowing from 200 ms to 15 s trips it (the retry-storm case of the post-mortem)."""

from __future__ import annotations

import heapq
from dataclasses import replace

import pytest

from batch.clock import FakeClock
from batch.resilience.breaker import REFUSED, CircuitBreaker, State
from batch.resilience.outcomes import Outcome
from batch.resilience.settings import ChainSettings
from tests.batch.test_client import INSTS
from tests.resilience.fakes import CONN, DOWN, FAULT, OK


def default_breaker(calls_per_second: float) -> tuple[CircuitBreaker, FakeClock]:
    provider = replace(INSTS.providers[0], calls_per_second=calls_per_second,
                       max_concurrency=20)
    clock = FakeClock()
    settings = ChainSettings.from_provider(provider)
    return CircuitBreaker(settings.breaker, clock=clock), clock


def run(b: CircuitBreaker, clock: FakeClock, *, rate: float, until: float, change_at: float,
        before: tuple[Outcome, float], after: tuple[Outcome, float]) -> list[float]:
    """From now to ``until``, start a call every 1/rate s; a call started before
    ``change_at`` ends as ``before`` (outcome, latency), later ones as ``after``. Returns the
    start times of the calls the breaker let through."""
    ends: list[tuple[float, int, int, Outcome, float]] = []  # (time, order, permit, ...)
    first = clock.monotonic()
    k = 0
    started: list[float] = []
    while first + k / rate < until or ends:
        start = first + k / rate
        if ends and (start >= until or ends[0][0] <= start):
            at, _, permit, outcome, latency = heapq.heappop(ends)
            clock.advance(at - clock.monotonic())
            b.record(outcome, latency, at, permit)
            continue
        clock.advance(start - clock.monotonic())
        permit = b.try_acquire(start)
        if permit != REFUSED:
            started.append(start)
            outcome, latency = before if start < change_at else after
            heapq.heappush(ends, (start + latency, k, permit, outcome, latency))
        k += 1
    return started


@pytest.mark.parametrize("rate", [1.4, 200.0], ids=["1.4-calls-per-s", "200-calls-per-s"])
@pytest.mark.parametrize("down", [DOWN, CONN, FAULT], ids=["50005", "refused", "50001"])
def test_an_outage_stops_the_calls_within_10_s_whatever_the_call_rate(
        rate: float, down: Outcome) -> None:
    b, clock = default_breaker(rate)
    outage = 120.0
    started = run(b, clock, rate=rate, until=outage + 25.0, change_at=outage,
                  before=(OK, 0.2), after=(down, 0.1))
    assert b.state is State.OPEN
    assert len([t for t in started if t < outage]) == round(outage * rate)  # none refused
    last = max(started)
    assert outage <= last <= outage + 10.0


def test_a_run_of_50005_answers_trips_the_circuit_before_the_window_would() -> None:
    # 20 healthy calls in the last 10 s keep the failure rate far under a half; the 5th
    # 50005 in a row trips it all the same.
    b, clock = default_breaker(2.0)
    started = run(b, clock, rate=2.0, until=40.0, change_at=10.0, before=(OK, 0.1),
                  after=(DOWN, 0.1))
    assert b.state is State.OPEN
    assert len(started) == 20 + 5
    assert b.rates()[0] < 0.5


def test_a_provider_slowing_from_200_ms_to_15_s_trips_the_circuit() -> None:
    b, clock = default_breaker(50.0)
    slowdown = 300.0
    started = run(b, clock, rate=2.0, until=slowdown + 40.0, change_at=slowdown,
                  before=(OK, 0.2), after=(OK, 15.0))
    assert b.state is State.OPEN
    # the first slow answers come back 15 s in; a few of them are enough
    assert max(started) <= slowdown + 15.0 + 5.0
    assert b.trips == 1


def test_healthy_calls_at_200_ms_or_even_2_s_never_trip_it() -> None:
    b, clock = default_breaker(50.0)
    run(b, clock, rate=5.0, until=600.0, change_at=300.0, before=(OK, 0.2), after=(OK, 2.0))
    assert b.state is State.CLOSED
    assert b.trips == 0
