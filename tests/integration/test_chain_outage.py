"""The chain against the simulator over real HTTP: a staged outage opens the breaker, calls
during OPEN never reach the provider (its own stats prove it), and the breaker closes once the
outage is over. Time is a FakeClock shared by the chain and the simulator's timeline."""

from __future__ import annotations

import pytest

from batch.client import MydataClient, make_http_client
from batch.clock import FakeClock
from batch.resilience.breaker import State
from batch.resilience.chain import ProviderChain
from batch.resilience.outcomes import Kind, Layer
from batch.resilience.settings import (
    BreakerSettings,
    ChainSettings,
    LimiterSettings,
    RetrySettings,
    WindowType,
)
from batch.simulator import Event, Scenario, Simulator
from batch.tranid import TranIdGenerator
from tests.integration.helpers import free_ports, make_institutions

pytestmark = pytest.mark.integration


async def test_outage_opens_the_breaker_open_calls_never_reach_the_provider_then_it_closes(
) -> None:
    clock = FakeClock()
    insts = make_institutions(free_ports(1), industries=("bank",))
    org = insts.providers[0].org_code
    scenario = Scenario(timeline=(Event(provider=org, start=30, end=90, kind="down",
                                        mode="503"),))
    settings = ChainSettings(
        breaker=BreakerSettings(window_type=WindowType.COUNT, window_size=10, minimum_calls=5,
                                failure_rate_threshold=0.5,
                                open_wait=20, half_open_permits=3),
        retry=RetrySettings(max_attempts=1),
        limiter=LimiterSettings(calls_per_second=1000, burst=10),
    )
    chain = ProviderChain(org, settings, clock=clock)
    http = make_http_client()
    client = MydataClient(insts.providers[0], http=http, chain=chain,
                          tran_ids=TranIdGenerator("OPERATOR01"), clock=clock)

    async def refresh(i: int) -> Kind:
        clock.advance(0.5)
        res = await client.refresh(access_token=f"token-{i:04d}", refresh_token=None)
        return res.outcome.kind

    def calls() -> int:
        return int(sim.stats()["providers"][org]["calls"])

    try:
        async with Simulator(insts, scenario, clock=clock) as sim:
            # Healthy: every refresh succeeds.
            assert {await refresh(i) for i in range(10)} == {Kind.SUCCESS}
            assert chain.breaker.state is State.CLOSED
            clock.advance(31 - clock.monotonic())  # t=31: the provider is down
            kinds = [await refresh(100 + i) for i in range(5)]
            assert kinds == [Kind.FAULT] * 5
            assert chain.breaker.state is State.OPEN
            # OPEN: refused by us, nothing reaches the provider.
            before = calls()
            for i in range(20):
                res = await client.refresh(access_token=f"token-{200 + i:04d}",
                                           refresh_token=None)
                assert res.outcome.kind is Kind.REJECTED
                assert res.outcome.layer is Layer.BREAKER
                assert res.calls == 0
            assert calls() == before
            # Still down when the first OPEN wait ends: the probes fail, it opens again.
            clock.advance(21)  # t~54
            assert chain.breaker.state is State.HALF_OPEN
            assert [await refresh(300 + i) for i in range(3)] == [Kind.FAULT] * 3
            assert chain.breaker.state is State.OPEN
            assert await refresh(399) is Kind.REJECTED  # a 4th probe is not let through
            # The outage ends at t=90; after the (doubled) wait the probes succeed and close.
            clock.advance(100 - clock.monotonic())  # re-trip doubled the wait: 40 s
            assert chain.breaker.state is State.HALF_OPEN
            assert [await refresh(400 + i) for i in range(3)] == [Kind.SUCCESS] * 3
            assert chain.breaker.state is State.CLOSED
            assert {await refresh(500 + i) for i in range(5)} == {Kind.SUCCESS}
            by_code = sim.stats()["providers"][org]["by_code"]
            assert by_code.get("50005", 0) == 8  # 5 to open + 3 failed probes: no more
    finally:
        await http.aclose()
