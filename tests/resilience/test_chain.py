"""The chain as a whole: the breaker in front, events, snapshot, cancellation."""

from __future__ import annotations

import asyncio
import json

import pytest

from batch.clock import FakeClock
from batch.resilience import (
    BreakerSettings,
    CallFinished,
    ChainSettings,
    Event,
    LimiterSettings,
    ProviderChain,
    Rejected,
    RetryScheduled,
    RetrySettings,
    State,
    StateChanged,
    WindowType,
)
from batch.resilience.outcomes import Kind, Layer, Outcome
from tests.resilience.fakes import FAULT, OK, Provider, drive, drive_all

BREAKER = BreakerSettings(window_type=WindowType.COUNT, window_size=4, minimum_calls=4,
                          open_wait=30.0,
                          half_open_permits=2)


def chain(clock: FakeClock, *, events: list[Event] | None = None,
          listeners: list[object] | None = None,
          limiter: LimiterSettings | None = None) -> ProviderChain:
    s = ChainSettings(breaker=BREAKER, retry=RetrySettings(max_attempts=2, budget_floor=100),
                      limiter=limiter or LimiterSettings(calls_per_second=1e6, burst=1000))
    ls: list[object] = list(listeners or [])
    if events is not None:
        ls.append(events.append)
    return ProviderChain("BANK000001", s, clock=clock, random=lambda: 0.0,
                         listeners=ls)  # type: ignore[arg-type]


async def trip(c: ProviderChain, clock: FakeClock) -> None:
    down = Provider(clock, default=FAULT)
    for _ in range(4):
        await drive(clock, c.call(down))
    assert c.breaker.state is State.OPEN


async def test_a_call_refused_by_the_open_breaker_touches_nothing_inside() -> None:
    clock = FakeClock()
    c = chain(clock, limiter=LimiterSettings(calls_per_second=1, burst=1, max_wait=1000))
    await trip(c, clock)
    before = c.snapshot()
    assert before["limiter"]["next_wait_s"] > 0  # type: ignore[index]
    started = clock.monotonic()
    provider = Provider(clock)
    out = await c.call(provider)
    assert out.kind is Kind.REJECTED and out.layer is Layer.BREAKER and out.attempts == 0
    assert provider.calls == 0
    assert c.snapshot() == before  # no limiter slot, no budget call, no bulkhead permit
    assert clock.monotonic() == started  # and no waiting


async def test_the_breaker_closes_again_after_the_probes_succeed() -> None:
    clock = FakeClock()
    events: list[Event] = []
    c = chain(clock, events=events)
    await trip(c, clock)
    clock.advance(30.0)
    provider = Provider(clock)
    outs = await drive_all(clock, [c.call(provider) for _ in range(2)])
    assert all(o.ok for o in outs)
    assert c.breaker.state is State.CLOSED
    assert [(e.old, e.new) for e in events if isinstance(e, StateChanged)] == [
        ("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


async def test_a_cancelled_probe_gives_its_permit_back() -> None:
    clock = FakeClock()
    c = chain(clock)
    await trip(c, clock)
    clock.advance(30.0)
    hanging = Provider(clock, latency=1000.0)
    tasks = [asyncio.ensure_future(c.call(hanging)) for _ in range(2)]
    await asyncio.sleep(0)
    out = await drive(clock, c.call(Provider(clock)))
    assert out.layer is Layer.BREAKER  # both permits taken
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    provider = Provider(clock)
    out = await drive(clock, c.call(provider))
    assert out.ok and provider.calls == 1
    tasks[1].cancel()
    await asyncio.gather(tasks[1], return_exceptions=True)


async def test_events_carry_the_provider_and_the_attempts_tran_ids() -> None:
    clock = FakeClock()
    events: list[Event] = []
    c = chain(clock, events=events)
    provider = Provider(clock, [FAULT, OK])
    out = await drive(clock, c.call(provider))
    retry = next(e for e in events if isinstance(e, RetryScheduled))
    done = next(e for e in events if isinstance(e, CallFinished))
    assert (retry.org_code, retry.tran_id, retry.attempt) == (
        "BANK000001", "OPERATOR01T00000000000000", 1)
    assert (done.tran_id, done.attempts, done.outcome) == ("OPERATOR01T00000000000001", 2, out)


async def test_a_failing_listener_never_breaks_a_call(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("metrics backend down")

    clock = FakeClock()
    events: list[Event] = []
    c = chain(clock, listeners=[broken], events=events)
    out = await drive(clock, c.call(Provider(clock)))
    assert out.ok
    assert any(isinstance(e, CallFinished) for e in events)  # later listeners still called
    assert "metrics backend down" in caplog.text


async def test_a_listener_that_names_its_events_hears_only_those() -> None:
    class Transitions:
        hears = frozenset({StateChanged})

        def __init__(self) -> None:
            self.got: list[Event] = []

        def __call__(self, event: Event) -> None:
            self.got.append(event)

    class Calls(Transitions):
        hears = frozenset({CallFinished})

    clock = FakeClock()
    events: list[Event] = []
    transitions, calls = Transitions(), Calls()
    c = chain(clock, listeners=[transitions, calls], events=events)
    await trip(c, clock)
    await drive(clock, c.call(Provider(clock)))  # refused by the open breaker
    assert [type(e) for e in transitions.got] == [StateChanged]
    assert [type(e) for e in calls.got] == [CallFinished] * 5
    assert calls.got == [e for e in events if isinstance(e, CallFinished)]
    assert {type(e) for e in events} > {StateChanged, CallFinished, Rejected}


async def test_no_listener_of_call_ends_no_call_finished_built() -> None:
    clock = FakeClock()
    seen: list[Event] = []

    class Transitions:
        hears = frozenset({StateChanged})

        def __call__(self, event: Event) -> None:
            seen.append(event)

    c = chain(clock, listeners=[Transitions()])
    assert not c._emit.calls and c._emit.active
    await trip(c, clock)
    assert [type(e) for e in seen] == [StateChanged]


async def test_rejections_by_layer_are_reported() -> None:
    clock = FakeClock()
    events: list[Event] = []
    c = chain(clock, events=events)
    await trip(c, clock)
    events.clear()
    out = await drive(clock, c.call(Provider(clock)))
    assert [e.layer for e in events if isinstance(e, Rejected)] == [Layer.BREAKER]
    assert [e.outcome for e in events if isinstance(e, CallFinished)] == [out]


async def test_a_deadline_already_past_is_rejected_without_an_attempt() -> None:
    clock = FakeClock()
    clock.advance(5.0)
    provider = Provider(clock)
    c = chain(clock)
    out = await drive(clock, c.call(provider, deadline=5.0))
    assert out.kind is Kind.REJECTED and out.layer is Layer.DEADLINE and provider.calls == 0
    assert c.breaker.rates()[2] == 0


async def test_each_attempt_gets_the_smaller_of_its_timeout_and_the_time_left() -> None:
    clock = FakeClock()
    provider = Provider(clock)
    c = chain(clock)
    await drive(clock, c.call(provider, deadline=7.5))
    await drive(clock, c.call(provider, deadline=1000.0))
    assert provider.timeouts == [7.5, 23.0]  # connect 3 + read 20 by default


async def test_the_snapshot_is_json_and_shows_every_layer() -> None:
    clock = FakeClock()
    c = chain(clock)
    await trip(c, clock)
    snap = json.loads(json.dumps(c.snapshot()))
    assert snap["breaker"]["state"] == "open"
    assert snap["breaker"]["failure_rate"] == 1.0
    assert snap["breaker"]["open_for_s"] == 30.0
    assert snap["bulkhead"] == {"in_use": 0, "waiting": 0, "max_concurrent": 20}
    assert snap["retry_budget"]["calls_in_window"] == 4
    assert snap["retry_budget"]["retries_in_window"] == 4
    assert snap["limiter"]["rate"] == 1e6


async def test_slow_attempts_open_the_breaker_but_waiting_for_a_slot_is_not_slowness() -> None:
    breaker = BreakerSettings(window_type=WindowType.COUNT, window_size=4, minimum_calls=4,
                              slow_call_duration=5.0,
                              slow_call_rate_threshold=0.5)
    clock = FakeClock()
    s = ChainSettings(breaker=breaker, limiter=LimiterSettings(calls_per_second=0.1, burst=1,
                                                               max_wait=100.0))
    c = ProviderChain("BANK000001", s, clock=clock)
    fast = Provider(clock, latency=0.1)
    outs = await drive_all(clock, [c.call(fast) for _ in range(4)])  # waits of 0, 10, 20, 30 s
    assert all(o.ok for o in outs) and c.breaker.state is State.CLOSED
    slow = Provider(clock, latency=6.0)
    for _ in range(2):
        await drive(clock, c.call(slow))
    assert c.breaker.state is State.OPEN  # 2 slow of the last 4


async def test_an_attempt_that_declines_itself_is_not_counted_as_an_attempt() -> None:
    from batch.resilience.outcomes import rejected

    clock = FakeClock()
    c = chain(clock)
    shutdown = rejected(Layer.SHUTDOWN, "stopping")
    out = await drive(clock, c.call(Provider(clock, [shutdown])))
    assert (out.kind, out.layer, out.attempts) == (Kind.REJECTED, Layer.SHUTDOWN, 0)
    out = await drive(clock, c.call(Provider(clock, [FAULT, shutdown])))
    assert (out.kind, out.rsp_code, out.attempts) == (Kind.FAULT, "50001", 1)
    assert c.breaker.rates() == (1.0, 0.0, 1)  # only the real fault was recorded


class _StallingClock(FakeClock):
    """A fake clock whose next wake-ups come late (a busy event loop): ``stalls`` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.stalls: list[float] = []

    async def sleep_until(self, deadline: float) -> None:
        await super().sleep_until(deadline)
        if self.stalls:
            self.advance(self.stalls.pop(0))


async def test_a_call_that_wakes_too_late_for_its_slot_takes_the_next_one_once() -> None:
    # 10 calls/s: a call may be half the 100 ms interval late, not 70 ms. Sent at once, the
    # late call would go 30 ms before the next slot's call.
    clock = _StallingClock()
    c = chain(clock, limiter=LimiterSettings(calls_per_second=10, burst=1, max_wait=5))
    provider = Provider(clock)
    assert (await drive(clock, c.call(provider))).kind is Kind.SUCCESS
    clock.stalls = [0.07]
    assert (await drive(clock, c.call(provider))).kind is Kind.SUCCESS
    assert provider.starts == pytest.approx([0.0, 0.2])
    assert c.limiter.late_slots == 1
    clock.stalls = [0.04]  # late within the tolerance: sent on its slot
    assert (await drive(clock, c.call(provider))).kind is Kind.SUCCESS
    assert provider.starts[-1] == pytest.approx(0.34)
    # late twice: the slot is given up once, then the call goes (an always-late worker
    # must not spend every slot missing it)
    clock.stalls = [0.07, 0.07]
    assert (await drive(clock, c.call(provider))).kind is Kind.SUCCESS
    assert provider.starts[-1] == pytest.approx(0.57)
    assert c.limiter.late_slots == 2


async def test_a_call_that_missed_its_slot_waiting_for_the_bulkhead_keeps_its_permit() -> None:
    # 100 calls/s (a slot every 10 ms, 5 ms late at most), one call in flight, 50 ms each:
    # the queued calls reach the bulkhead long after their slots. Each takes a new slot but
    # keeps the permit it was handed: the others stay queued behind it, in order, and the
    # permit never goes round the queue of waiters (each as late) while none of them calls.
    from batch.resilience.settings import BulkheadSettings

    clock = FakeClock()
    s = ChainSettings(breaker=BREAKER, retry=RetrySettings(max_attempts=1, budget_floor=100),
                      limiter=LimiterSettings(calls_per_second=100, burst=1, max_wait=5),
                      bulkhead=BulkheadSettings(max_concurrent=1, max_wait=5))
    c = ProviderChain("BANK000001", s, clock=clock, random=lambda: 0.0)
    provider = Provider(clock, latency=0.05)
    queued_at_start: list[int] = []

    async def attempt(timeout_s: float) -> Outcome:
        queued_at_start.append(c.bulkhead.waiting)
        return await provider(timeout_s)

    outs = await drive_all(clock, [c.call(attempt) for _ in range(4)])
    assert all(o.kind is Kind.SUCCESS for o in outs)
    assert provider.starts == pytest.approx([0.0, 0.05, 0.10, 0.15])
    assert queued_at_start == [0, 2, 1, 0]  # the first went before the others queued
    assert c.limiter.late_slots == 3
    assert c.bulkhead.in_use == 0
