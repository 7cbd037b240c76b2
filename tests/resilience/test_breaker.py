"""The circuit breaker on its own, its clock stepped by hand."""

from __future__ import annotations

import pytest

from batch.clock import FakeClock
from batch.resilience.breaker import CALL, PROBE, REFUSED, CircuitBreaker, State
from batch.resilience.events import Emitter, Event, StateChanged
from batch.resilience.outcomes import Layer, Outcome, rejected, timed_out
from batch.resilience.settings import BreakerSettings, WindowType
from tests.resilience.fakes import BAD_REQUEST, DEAD, DONE_WEEK, FAULT, OK, THROTTLED

SETTINGS = BreakerSettings(window_type=WindowType.COUNT, window_size=10, minimum_calls=4,
                           failure_rate_threshold=0.5,
                           slow_call_duration=5.0, slow_call_rate_threshold=0.5,
                           open_wait=10.0, open_wait_multiplier=2.0, open_wait_max=35.0,
                           half_open_permits=3, half_open_max_time=20.0)


def make(settings: BreakerSettings = SETTINGS) -> tuple[CircuitBreaker, FakeClock, list[Event]]:
    clock = FakeClock()
    events: list[Event] = []
    return CircuitBreaker(settings, clock=clock, org_code="BANK000001",
                          emit=Emitter([events.append])), clock, events


def call(b: CircuitBreaker, clock: FakeClock, outcome: Outcome, duration: float = 0.1) -> int:
    permit = b.try_acquire(clock.monotonic())
    if permit:
        b.record(outcome, duration, clock.monotonic(), permit, outcome.tran_id)
    return permit


def trip(b: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(4):
        call(b, clock, FAULT)
    assert b.state is State.OPEN


def test_opens_when_failure_rate_reaches_threshold_after_minimum_calls() -> None:
    b, clock, _ = make()
    for o in (OK, FAULT, OK):
        call(b, clock, o)
    assert b.state is State.CLOSED  # 3 calls < minimum 4, though 1/3 < 0.5 anyway
    call(b, clock, FAULT)  # 2/4 = 0.5 >= 0.5
    assert b.state is State.OPEN


def test_does_not_judge_before_minimum_calls() -> None:
    b, clock, _ = make()
    for _ in range(3):
        call(b, clock, FAULT)
    assert b.state is State.CLOSED
    call(b, clock, FAULT)
    assert b.state is State.OPEN


def test_timeouts_count_as_failures() -> None:
    b, clock, _ = make()
    for _ in range(4):
        call(b, clock, timed_out())
    assert b.state is State.OPEN


@pytest.mark.parametrize("neutral", [
    rejected(Layer.LIMITER), rejected(Layer.BULKHEAD), rejected(Layer.DEADLINE),
    THROTTLED, DEAD, DONE_WEEK, BAD_REQUEST,
], ids=lambda o: f"{o.kind}-{o.rsp_code or o.layer}")
def test_neutral_outcomes_are_never_recorded(neutral: Outcome) -> None:
    b, clock, _ = make()
    for _ in range(50):
        call(b, clock, neutral)
    assert b.rates() == (0.0, 0.0, 0)
    for _ in range(3):
        call(b, clock, FAULT)
    assert b.state is State.CLOSED  # below the minimum: neutrals were not counted as calls
    call(b, clock, OK)
    assert b.state is State.OPEN  # 3/4: neutrals were not counted as successes either


def test_count_window_forgets_the_oldest_call() -> None:
    b, clock, _ = make(BreakerSettings(window_type=WindowType.COUNT, window_size=4, minimum_calls=4,
                                       failure_rate_threshold=0.75))
    for o in (FAULT, FAULT, OK, OK):
        call(b, clock, o)
    call(b, clock, FAULT)  # window now FAULT OK OK FAULT: 0.5
    assert b.rates()[0] == 0.5
    assert b.state is State.CLOSED
    call(b, clock, FAULT)  # OK OK FAULT FAULT -> still 0.5
    call(b, clock, FAULT)  # OK FAULT FAULT FAULT -> 0.75
    assert b.state is State.OPEN


def test_time_window_forgets_calls_older_than_the_window() -> None:
    b, clock, _ = make(BreakerSettings(window_type=WindowType.TIME, window_size=10,
                                       minimum_calls=4, failure_rate_threshold=0.5))
    for _ in range(3):
        call(b, clock, FAULT)
    clock.advance(10.0)  # those three fell out of (now-10 s, now]
    assert b.rates() == (0.0, 0.0, 0)
    call(b, clock, FAULT)
    assert b.state is State.CLOSED
    clock.advance(9.0)
    for _ in range(2):
        call(b, clock, OK)
    call(b, clock, FAULT)  # 2 of 4 in the window
    assert b.state is State.OPEN


def test_slow_calls_open_the_circuit_even_when_they_succeed() -> None:
    b, clock, _ = make()
    call(b, clock, OK, duration=5.0)
    call(b, clock, OK, duration=4.9)
    call(b, clock, OK, duration=0.1)
    assert b.state is State.CLOSED
    call(b, clock, OK, duration=6.0)
    assert b.state is State.OPEN


def test_open_refuses_until_its_wait_is_over_then_half_open() -> None:
    b, clock, events = make()
    trip(b, clock)
    clock.advance(9.999)
    assert b.try_acquire(clock.monotonic()) == REFUSED
    clock.advance(0.001)
    assert b.state is State.HALF_OPEN
    assert [(e.old, e.new) for e in events if isinstance(e, StateChanged)] == [
        ("closed", "open"), ("open", "half_open")]


def test_half_open_lets_exactly_n_probes_through() -> None:
    b, clock, _ = make()
    trip(b, clock)
    clock.advance(10)
    permits = [b.try_acquire(clock.monotonic()) for _ in range(10)]
    assert [p >= PROBE for p in permits] == [True] * 3 + [False] * 7


def test_a_neutral_probe_gives_its_permit_back() -> None:
    b, clock, _ = make()
    trip(b, clock)
    clock.advance(10)
    p = [b.try_acquire(0 + clock.monotonic()) for _ in range(3)]
    assert b.try_acquire(clock.monotonic()) == REFUSED
    b.record(rejected(Layer.LIMITER), 0.0, clock.monotonic(), p[0])
    assert b.try_acquire(clock.monotonic()) >= PROBE
    assert b.try_acquire(clock.monotonic()) == REFUSED


def test_successful_probes_close_and_reset_the_wait() -> None:
    b, clock, _ = make()
    trip(b, clock)
    clock.advance(10)
    for _ in range(2):
        call(b, clock, OK)
    assert b.state is State.HALF_OPEN
    call(b, clock, OK)
    assert b.state is State.CLOSED
    assert b.rates() == (0.0, 0.0, 0)  # a fresh window
    trip(b, clock)
    assert b.open_until == clock.monotonic() + 10.0  # the first wait again


def test_failed_probes_reopen_with_a_growing_capped_wait() -> None:
    b, clock, _ = make()
    trip(b, clock)
    waits = []
    for _ in range(4):
        waits.append(b.open_until - clock.monotonic())  # type: ignore[operator]
        clock.advance(waits[-1])
        call(b, clock, FAULT)
        call(b, clock, OK)
        call(b, clock, FAULT)  # 2/3 >= 0.5
        assert b.state is State.OPEN
    assert waits == [10.0, 20.0, 35.0, 35.0]


def test_half_open_too_long_goes_back_to_open() -> None:
    b, clock, _ = make()
    trip(b, clock)
    clock.advance(10)
    p = b.try_acquire(clock.monotonic())
    assert p >= PROBE
    clock.advance(19.999)
    assert b.state is State.HALF_OPEN
    clock.advance(0.001)
    assert b.state is State.OPEN
    assert b.trips == 2
    # the late probe's answer belongs to a finished half-open period: ignored
    b.record(OK, 0.1, clock.monotonic(), p)
    assert b.state is State.OPEN


def test_a_late_answer_from_a_closed_period_is_not_a_probe() -> None:
    b, clock, _ = make()
    early = b.try_acquire(clock.monotonic())
    assert early == CALL
    trip(b, clock)
    clock.advance(10)
    assert b.state is State.HALF_OPEN
    b.record(OK, 0.1, clock.monotonic(), early)
    b.record(OK, 0.1, clock.monotonic(), early)
    b.record(OK, 0.1, clock.monotonic(), early)
    assert b.state is State.HALF_OPEN


def test_forced_open_refuses_everything_until_reset() -> None:
    b, clock, _ = make()
    b.force_open()
    clock.advance(1000)
    assert b.try_acquire(clock.monotonic()) == REFUSED
    assert b.state is State.FORCED_OPEN
    b.reset()
    assert b.try_acquire(clock.monotonic()) == CALL


def test_disabled_lets_everything_through_and_never_opens() -> None:
    b, clock, _ = make()
    b.disable()
    for _ in range(100):
        assert call(b, clock, FAULT) == CALL
    assert b.state is State.DISABLED
    assert b.rates() == (0.0, 0.0, 0)


def test_metrics_only_records_rates_but_never_opens() -> None:
    b, clock, _ = make()
    b.metrics_only()
    for _ in range(20):
        assert call(b, clock, FAULT) == CALL
    assert b.state is State.METRICS_ONLY
    assert b.rates() == (1.0, 0.0, 10)


def test_transitions_carry_the_provider_and_the_deciding_tran_id() -> None:
    b, clock, events = make()
    for i in range(4):
        call(b, clock, FAULT.with_(tran_id=f"T{i}"))
    change = events[-1]
    assert isinstance(change, StateChanged)
    assert (change.org_code, change.new, change.tran_id, change.reason) == (
        "BANK000001", "open", "T3", "failure rate")


def test_is_open_while_every_call_is_refused_and_no_longer() -> None:
    b, clock, _ = make()
    assert not b.is_open  # CLOSED
    trip(b, clock)
    assert b.is_open and b.try_acquire(clock.monotonic()) == REFUSED
    clock.advance(SETTINGS.open_wait)  # the wait over: HALF_OPEN, read as it is now
    assert not b.is_open and b.state is State.HALF_OPEN
    b.force_open()
    assert b.is_open and b.try_acquire(clock.monotonic()) == REFUSED
    for mode in (b.disable, b.metrics_only, b.reset):
        mode()
        assert not b.is_open and b.try_acquire(clock.monotonic()) == CALL
