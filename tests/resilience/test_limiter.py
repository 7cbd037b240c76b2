"""The rate limiter: even spacing after the burst, maximum wait, adaptive back-off, pauses."""

from __future__ import annotations

from itertools import pairwise

import pytest

from batch.clock import FakeClock
from batch.resilience import (
    BreakerSettings,
    ChainSettings,
    Event,
    LimiterSettings,
    ProviderChain,
    RateAdjusted,
    RetrySettings,
)
from batch.resilience.limiter import RateLimiter
from batch.resilience.outcomes import Kind, Layer, classify
from tests.resilience.fakes import FAULT, OK, PAUSED, THROTTLED, Provider, drive_all


def chain(clock: FakeClock, limiter: LimiterSettings, *,
          events: list[Event] | None = None) -> ProviderChain:
    s = ChainSettings(limiter=limiter, retry=RetrySettings(max_attempts=3, budget_floor=100),
                      breaker=BreakerSettings(minimum_calls=100))
    return ProviderChain("BANK000001", s, clock=clock, random=lambda: 0.0,
                         listeners=[events.append] if events is not None else ())


async def test_calls_are_spaced_evenly_beyond_the_burst() -> None:
    clock = FakeClock()
    provider = Provider(clock)
    c = chain(clock, LimiterSettings(calls_per_second=10, burst=3, max_wait=60))
    outs = await drive_all(clock, [c.call(provider) for _ in range(30)])
    assert all(o.ok for o in outs)
    starts = sorted(provider.starts)
    assert starts[:3] == [0.0, 0.0, 0.0]
    gaps = [b - a for a, b in pairwise(starts[2:])]
    assert min(gaps) >= 0.1 - 1e-9  # no two closer than the interval beyond the burst
    assert max(gaps) <= 0.1 + 1e-9  # and no slack either: an even spread
    # over any window, at most burst + rate x span calls
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 3 + 10 * (starts[j] - starts[i]) + 1e-6


async def test_a_call_that_would_wait_too_long_is_rejected_and_reserves_nothing() -> None:
    clock = FakeClock()
    provider = Provider(clock)
    c = chain(clock, LimiterSettings(calls_per_second=1, burst=1, max_wait=2.0))
    outs = await drive_all(clock, [c.call(provider) for _ in range(5)])
    kinds = [(o.kind, o.layer, o.attempts) for o in outs]
    assert kinds[:3] == [(Kind.SUCCESS, None, 1)] * 3  # slots at 0, 1, 2
    assert kinds[3:] == [(Kind.REJECTED, Layer.LIMITER, 0)] * 2
    assert provider.starts == [0.0, 1.0, 2.0]
    assert c.breaker.rates()[2] == 3  # rejections are not recorded
    # the refused calls took no slot: the next one gets the slot right after the last
    assert c.limiter.reserve(2.0, 10.0) == 1.0


async def test_a_retry_refused_by_the_limiter_returns_the_real_fault() -> None:
    clock = FakeClock()
    provider = Provider(clock, [FAULT])
    c = chain(clock, LimiterSettings(calls_per_second=1, burst=1, max_wait=0.0))
    [out] = await drive_all(clock, [c.call(provider)])
    assert out.kind is Kind.FAULT and out.attempts == 1 and provider.calls == 1


def test_42902_lowers_the_rate_holds_it_then_recovers() -> None:
    events: list[Event] = []
    from batch.resilience.events import Emitter
    lim = RateLimiter(LimiterSettings(calls_per_second=40, throttle_factor=0.5,
                                      min_rate_fraction=0.2, throttle_hold=30,
                                      recovery_time=60), emit=Emitter([events.append]))
    assert lim.rate(0.0) == 40
    lim.observe(THROTTLED.with_(tran_id="T1"), now=0.0)
    assert lim.rate(0.0) == 20
    lim.observe(THROTTLED, now=0.5)  # answers to calls already in flight: no pile-up
    assert lim.rate(0.5) == 20
    lim.observe(THROTTLED, now=2.0)
    assert lim.rate(2.0) == 10
    assert lim.rate(31.9) == 10  # held for 30 s after the last 42902
    assert lim.rate(62.0) == pytest.approx(10 + 30 * 0.5)  # halfway through recovery
    assert lim.rate(92.0) == 40
    assert [(e.reason, e.rate) for e in events if isinstance(e, RateAdjusted)] == [
        ("throttled", 20.0), ("throttled", 10.0), ("recovered", 40.0)]
    assert events[0].tran_id == "T1"  # type: ignore[union-attr]


def test_the_rate_never_drops_below_its_floor() -> None:
    lim = RateLimiter(LimiterSettings(calls_per_second=100, min_rate_fraction=0.1))
    for i in range(20):
        lim.observe(THROTTLED, now=float(i * 2))
    assert lim.rate(40.0) == pytest.approx(10.0)


async def test_after_a_42902_calls_are_spaced_at_the_lower_rate() -> None:
    clock = FakeClock()
    provider = Provider(clock, [THROTTLED])
    c = chain(clock, LimiterSettings(calls_per_second=10, burst=1, max_wait=60,
                                     throttle_factor=0.5, throttle_hold=100))
    outs = await drive_all(clock, [c.call(provider) for _ in range(6)])
    assert outs[0].kind is Kind.THROTTLED and outs[0].attempts == 1  # not retried
    gaps = [b - a for a, b in pairwise(provider.starts[1:])]
    assert gaps[-1] == pytest.approx(0.2)  # 5 calls/s once the slots booked before it pass


async def test_40301_pauses_the_provider() -> None:
    clock = FakeClock()
    provider = Provider(clock, [PAUSED])
    c = chain(clock, LimiterSettings(calls_per_second=100, burst=1, max_wait=60, pause=10))
    await drive_all(clock, [c.call(provider)])
    await drive_all(clock, [c.call(provider)])
    assert provider.starts == [0.0, 10.0]


async def test_retry_after_pauses_the_provider_for_that_long() -> None:
    clock = FakeClock()
    provider = Provider(clock, [classify(429, None, retry_after=7.0)])
    c = chain(clock, LimiterSettings(calls_per_second=100, burst=1, max_wait=60))
    await drive_all(clock, [c.call(provider)])
    await drive_all(clock, [c.call(provider)])
    assert provider.starts == [0.0, 7.0]


async def test_a_pause_beyond_the_maximum_wait_rejects() -> None:
    clock = FakeClock()
    provider = Provider(clock, [PAUSED, OK])
    c = chain(clock, LimiterSettings(calls_per_second=100, max_wait=1.0, pause=10))
    outs = await drive_all(clock, [c.call(provider)])
    outs += await drive_all(clock, [c.call(provider)])
    assert [o.kind for o in outs] == [Kind.THROTTLED, Kind.REJECTED]
    assert outs[1].layer is Layer.LIMITER
