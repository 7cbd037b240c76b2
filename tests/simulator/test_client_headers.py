"""The client's token refresh over real HTTP: the simulator sees every header MYDATA.md
asks for on every call, the token request included."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from batch.client import MydataClient, make_http_client
from batch.clock import FakeClock
from batch.resilience.outcomes import Kind, Outcome
from batch.simulator import Behaviour, Scenario
from batch.tranid import TranIdGenerator
from tests.simulator.conftest import StartSim


class PassThrough:
    async def call(self, attempt: Callable[[float], Awaitable[Outcome]], *,
                   deadline: float | None = None) -> Outcome:
        return await attempt(10.0)


async def test_every_call_of_a_refresh_with_a_token_renewal_is_typed_scheduled(
        start_sim: StartSim, clock: FakeClock) -> None:
    sim, _ = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0,
                                                         expired_tokens=frozenset({"old"}))))
    bank = next(p for p in sim.institutions.providers if p.org_code == "BANK000001")
    http = make_http_client()
    try:
        client = MydataClient(bank, http=http, chain=PassThrough(),
                              tran_ids=TranIdGenerator("OPERATOR01", 5), clock=clock)
        res = await client.refresh(access_token="old", refresh_token="r1")
    finally:
        await http.aclose()
    assert res.outcome.kind is Kind.SUCCESS and res.new_access_token
    stats = sim.stats()["providers"]["BANK000001"]
    assert stats["by_route"]["POST /oauth/2.0/token"] == 1
    assert stats["by_api_type"] == {"scheduled": stats["calls"]}
    # the old token rode along: the new one aliases to the same consent (no second transfer)
    assert stats["violations"]["second_transfer"] == 0
