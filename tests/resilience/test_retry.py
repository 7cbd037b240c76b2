"""Retry through the chain: what is retried, the exact waits, the budget, the deadline."""

from __future__ import annotations

import pytest

from batch.clock import FakeClock
from batch.resilience import (
    BreakerSettings,
    ChainSettings,
    Event,
    LimiterSettings,
    ProviderChain,
    RetryScheduled,
    RetrySettings,
    RetrySkipped,
    State,
    TimeoutSettings,
    WindowType,
)
from batch.resilience.outcomes import Kind, Outcome, classify
from batch.resilience.retry import Backoff, RetryBudget
from tests.resilience.fakes import (
    BAD_REQUEST,
    CONN,
    DEAD,
    DONE_WEEK,
    DOWN,
    FAULT,
    OK,
    PAUSED,
    THROTTLED,
    UNKNOWN,
    Provider,
    drive,
    drive_all,
)

FAST = LimiterSettings(calls_per_second=1e6, burst=1000)


def chain(clock: FakeClock, *, retry: RetrySettings | None = None,
          breaker: BreakerSettings | None = None, timeouts: TimeoutSettings | None = None,
          events: list[Event] | None = None, rnd: float = 1.0) -> ProviderChain:
    s = ChainSettings(retry=retry or RetrySettings(), breaker=breaker or BreakerSettings(),
                      limiter=FAST, timeouts=timeouts or TimeoutSettings())
    return ProviderChain("BANK000001", s, clock=clock, random=lambda: rnd,
                         listeners=[events.append] if events is not None else ())


@pytest.mark.parametrize("fault", [FAULT, DOWN, CONN, classify(502, None)],
                         ids=["50001", "50005", "connection", "bare-5xx"])
async def test_transient_faults_are_retried_with_exact_full_jitter_waits(
        fault: Outcome) -> None:
    clock = FakeClock()
    provider = Provider(clock, [fault, fault, OK])
    c = chain(clock, retry=RetrySettings(max_attempts=3, backoff_base=0.2,
                                         backoff_multiplier=2.0), rnd=0.5)
    out = await drive(clock, c.call(provider))
    assert out.ok and out.attempts == 3
    assert provider.starts == [0.0, 0.1, pytest.approx(0.3)]  # 0.5 x 0.2, then 0.5 x 0.4


@pytest.mark.parametrize("answer", [UNKNOWN, THROTTLED, PAUSED, DEAD, DONE_WEEK, BAD_REQUEST,
                                    classify(500, "59999")],
                         ids=["50003", "42902", "40301", "40305", "42901", "40001",
                              "5xx-with-unknown-code"])
async def test_never_retried(answer: Outcome) -> None:
    clock = FakeClock()
    provider = Provider(clock, [answer], default=OK)
    out = await drive(clock, chain(clock).call(provider))
    assert provider.calls == 1
    assert out.kind is answer.kind and out.attempts == 1


async def test_a_timeout_is_never_retried() -> None:
    clock = FakeClock()
    provider = Provider(clock, latency=100.0)
    c = chain(clock, timeouts=TimeoutSettings(connect_timeout=1.0, read_timeout=4.0))
    out = await drive(clock, c.call(provider))
    assert out.kind is Kind.TIMEOUT and out.attempts == 1
    assert provider.calls == 1
    assert clock.monotonic() == 5.0  # connect + read


async def test_backoff_is_capped() -> None:
    b = Backoff(RetrySettings(backoff_base=1.0, backoff_multiplier=10.0, backoff_max=7.0),
                random=lambda: 1.0)
    assert [b.wait(n) for n in (1, 2, 3, 50)] == [1.0, 7.0, 7.0, 7.0]


async def test_attempts_stop_at_max_attempts() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT)
    events: list[Event] = []
    out = await drive(clock, chain(clock, retry=RetrySettings(max_attempts=4),
                                   events=events).call(provider))
    assert provider.calls == 4 and out.attempts == 4 and out.kind is Kind.FAULT
    assert [e.attempt for e in events if isinstance(e, RetryScheduled)] == [1, 2, 3]
    assert [e.reason for e in events if isinstance(e, RetrySkipped)] == ["attempts exhausted"]


async def test_retries_never_make_the_breaker_open_sooner() -> None:
    breaker = BreakerSettings(window_type=WindowType.COUNT, window_size=10, minimum_calls=5,
                              failure_rate_threshold=0.5)
    opened_after: dict[int, int | None] = {}
    for attempts in (1, 3):
        clock = FakeClock()
        provider = Provider(clock, lambda n: FAULT if n % 2 == 0 else OK)  # every other fails
        c = chain(clock, breaker=breaker, retry=RetrySettings(max_attempts=attempts,
                                                              budget_floor=1000))
        opened_after[attempts] = None
        for calls in range(1, 51):
            await drive(clock, c.call(provider))
            if c.breaker.state is not State.CLOSED:
                opened_after[attempts] = calls
                break
    # without retries half the calls fail; with them every call succeeds on its 2nd attempt
    assert opened_after == {1: 5, 3: None}


async def test_a_hard_down_provider_opens_after_the_same_number_of_calls_with_retries() -> None:
    breaker = BreakerSettings(window_type=WindowType.COUNT, window_size=10, minimum_calls=5,
                              failure_rate_threshold=0.5)
    calls_to_open = []
    attempts_seen = []
    for attempts in (1, 3):
        clock = FakeClock()
        provider = Provider(clock, default=DOWN)
        c = chain(clock, breaker=breaker, retry=RetrySettings(max_attempts=attempts,
                                                              budget_floor=1000))
        calls = 0
        while c.breaker.state is State.CLOSED:
            await drive(clock, c.call(provider))
            calls += 1
        calls_to_open.append(calls)
        attempts_seen.append(provider.calls)
        assert c.breaker.rates()[2] == 5  # one record per logical call, not per attempt
    assert calls_to_open == [5, 5]
    assert attempts_seen == [5, 15]


async def test_the_retry_budget_caps_retries_when_a_provider_fails_hard() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT)
    retry = RetrySettings(max_attempts=3, budget_ratio=0.2, budget_floor=3, budget_window=10)
    c = chain(clock, retry=retry)
    c.breaker.disable()  # keep calls flowing: we look at the budget alone
    calls = 200
    outs = await drive_all(clock, [c.call(provider) for _ in range(calls)])
    retries = provider.calls - calls
    assert clock.monotonic() < 10  # all inside one budget window
    assert retries <= 0.2 * calls + 3
    assert retries >= 0.2 * calls  # the budget, not something else, is what stopped them
    assert sum(o.attempts for o in outs) == provider.calls


def test_the_budget_refills_as_calls_roll_out_of_its_window() -> None:
    budget = RetryBudget(RetrySettings(budget_ratio=0.5, budget_floor=0, budget_window=10))
    for _ in range(4):
        budget.note_call(0.0)
    assert [budget.try_spend(0.5) for _ in range(3)] == [True, True, False]
    assert budget.available(9.9) == 0
    assert budget.available(10.0) == 0  # calls and retries both left the window
    for _ in range(2):
        budget.note_call(10.0)
    assert budget.try_spend(10.0) and not budget.try_spend(10.0)


async def test_no_retries_while_the_breaker_is_half_open() -> None:
    clock = FakeClock()
    breaker = BreakerSettings(window_type=WindowType.COUNT, window_size=4, minimum_calls=4,
                              open_wait=10.0,
                              half_open_permits=2)
    provider = Provider(clock, default=FAULT)
    c = chain(clock, breaker=breaker, retry=RetrySettings(max_attempts=5, budget_floor=1000))
    for _ in range(4):
        await drive(clock, c.call(provider))
    assert c.breaker.state is State.OPEN and provider.calls == 20  # retried while closed
    clock.advance(10.0)
    out = await drive(clock, c.call(provider))
    assert out.attempts == 1 and provider.calls == 21  # the probe is not retried


async def test_no_retry_starts_without_its_minimum_time_before_the_deadline() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT, latency=1.0)
    c = chain(clock, retry=RetrySettings(max_attempts=10, backoff_base=0.1,
                                         backoff_multiplier=1.0, min_attempt_time=1.0))
    out = await drive(clock, c.call(provider, deadline=3.5))
    # a 4th attempt would start at 3.3 with 0.2 s left: skipped, the fault is returned
    assert provider.starts == [0.0, 1.1, pytest.approx(2.2)]
    assert out.kind is Kind.FAULT and out.attempts == 3
    assert clock.monotonic() == pytest.approx(3.2)


async def test_the_deadline_bounds_every_attempt() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT, latency=1.0)
    c = chain(clock, retry=RetrySettings(max_attempts=10, backoff_base=0.1,
                                         backoff_multiplier=1.0, min_attempt_time=0.1),
              rnd=1.0)
    out = await drive(clock, c.call(provider, deadline=3.5))
    # attempts at 0, 1.1, 2.2 (each 1 s + 0.1 s backoff); a 4th would start at 3.3 with
    # 0.2 s left and is given only that much
    assert provider.starts == [0.0, 1.1, pytest.approx(2.2), pytest.approx(3.3)]
    assert provider.timeouts[-1] == pytest.approx(0.2)
    assert out.kind is Kind.TIMEOUT and out.attempts == 4
    assert clock.monotonic() == pytest.approx(3.5)


async def test_no_backoff_sleeps_past_the_deadline() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT, latency=1.0)
    events: list[Event] = []
    c = chain(clock, retry=RetrySettings(backoff_base=5.0), events=events)
    out = await drive(clock, c.call(provider, deadline=4.0))
    assert out.kind is Kind.FAULT and out.attempts == 1
    assert clock.monotonic() == 1.0  # returned the last outcome at once, no pointless sleep
    assert [e.reason for e in events if isinstance(e, RetrySkipped)] == ["deadline"]


async def test_default_deadline_is_the_call_deadline() -> None:
    clock = FakeClock()
    provider = Provider(clock, default=FAULT, latency=10.0)
    c = chain(clock, retry=RetrySettings(max_attempts=100, backoff_base=0.01),
              timeouts=TimeoutSettings(call_deadline=25.0))
    out = await drive(clock, c.call(provider))
    assert clock.monotonic() <= 25.0
    assert out.attempts == 3
