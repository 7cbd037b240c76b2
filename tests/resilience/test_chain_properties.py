"""Properties of the whole chain over random provider behaviour, on the fake clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from batch.clock import FakeClock
from batch.resilience import (
    BreakerSettings,
    ChainSettings,
    LimiterSettings,
    ProviderChain,
    RetrySettings,
    State,
    WindowType,
)
from batch.resilience.outcomes import Kind
from tests.resilience.fakes import (
    BAD_REQUEST,
    CONN,
    DEAD,
    DOWN,
    FAULT,
    OK,
    THROTTLED,
    UNKNOWN,
    Provider,
    drive_all,
)

ANSWERS = [OK, FAULT, DOWN, CONN, UNKNOWN, THROTTLED, DEAD, BAD_REQUEST]
RETRY = RetrySettings(max_attempts=4, backoff_base=0.5, backoff_max=4.0, budget_ratio=0.2,
                      budget_floor=2, budget_window=3600, min_attempt_time=0.5)

call_plan = st.tuples(
    st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=5),   # answers, in order
    st.sampled_from([0.0, 0.5, 2.0, 30.0]),                       # latency of each attempt
    st.sampled_from([1.0, 5.0, 20.0, 60.0]),                      # deadline from now
)


@settings(max_examples=60, deadline=None)
@given(st.lists(call_plan, min_size=1, max_size=25), st.floats(0.0, 1.0))
async def test_every_call_keeps_to_retry_rules_budget_and_deadline(
        plans: list[tuple[list[object], float, float]], jitter: float) -> None:
    clock = FakeClock()
    s = ChainSettings(retry=RETRY, limiter=LimiterSettings(calls_per_second=20, burst=2,
                                                           max_wait=3.0),
                      breaker=BreakerSettings(minimum_calls=1000))
    chain = ProviderChain("BANK000001", s, clock=clock, random=lambda: jitter)
    providers = [Provider(clock, answers, latency=latency,  # type: ignore[arg-type]
                          default=FAULT) for answers, latency, _ in plans]
    deadlines = [d for _, _, d in plans]
    outs = await drive_all(clock, [chain.call(p, deadline=d)
                                   for p, d in zip(providers, deadlines, strict=True)])
    retries = 0
    for p, d, out in zip(providers, deadlines, outs, strict=True):
        assert out.attempts == p.calls <= RETRY.max_attempts
        retries += max(0, p.calls - 1)
        assert all(end <= d + 1e-9 for end in p.ends)  # the deadline bounds every attempt
        assert all(start + t <= d + 1e-9 for start, t in zip(p.starts, p.timeouts,
                                                             strict=True))
        if out.kind is Kind.REJECTED:
            assert out.attempts == 0
    assert retries <= RETRY.budget_ratio * len(plans) + RETRY.budget_floor
    assert chain.bulkhead.in_use == 0 and chain.bulkhead.waiting == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=60), st.integers(1, 4))
async def test_retries_never_make_the_breaker_open_sooner(answers: list[object],
                                                          attempts: int) -> None:
    """Same provider answers for each call's first attempt; retries can only turn a
    failure into a success, so with retries the breaker opens no earlier."""
    results: dict[int, int | None] = {}
    for max_attempts in (1, attempts):
        clock = FakeClock()
        s = ChainSettings(retry=RetrySettings(max_attempts=max_attempts, budget_floor=10_000),
                          limiter=LimiterSettings(calls_per_second=1e6, burst=1000),
                          breaker=BreakerSettings(window_type=WindowType.COUNT, window_size=10,
                                                  minimum_calls=5,
                                                  open_wait=1e6, open_wait_max=1e6))
        chain = ProviderChain("BANK000001", s, clock=clock, random=lambda: 0.0)
        results[max_attempts] = None
        for i, first in enumerate(answers):
            # the first attempt gets the scripted answer; any retry of it succeeds
            await drive_all(clock, [chain.call(Provider(clock, [first],  # type: ignore[list-item]
                                                        default=OK))])
            if chain.breaker.state is not State.CLOSED:
                results[max_attempts] = i
                break
    if results[attempts] is not None:
        assert results[1] is not None and results[1] <= results[attempts]
