"""Edge 2 over real HTTP: a list call stopped after page 1 continues at its cursor, and the
simulator, like a provider, takes the continuation as part of the same transfer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from batch.client import MydataClient, Progress, make_http_client
from batch.clock import FakeClock
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected
from batch.simulator import Behaviour, Scenario, consent_key
from batch.tranid import TranIdGenerator
from tests.simulator.conftest import StartSim


class RefuseNth:
    """A chain that refuses its ``n``th call as our limiter would (nothing sent)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.calls = n, 0

    async def call(self, attempt: Callable[[float], Awaitable[Outcome]], *,
                   deadline: float | None = None) -> Outcome:
        self.calls += 1
        if self.calls == self.n:
            return rejected(Layer.LIMITER, "limiter")
        return await attempt(10.0)


async def _refresh(start_sim: StartSim, clock: FakeClock, *, resume: bool) -> tuple[
        Progress | None, Outcome, dict[str, Any]]:
    sim, _ = await start_sim(Scenario(defaults=Behaviour(latency_median_ms=0, items_min=5,
                                                         items_max=5)))
    provider = sim.institutions.providers[0]
    http = make_http_client()
    tran_ids = TranIdGenerator("OPERATOR01", node_id=1)
    try:
        first = MydataClient(provider, http=http, chain=RefuseNth(2), tran_ids=tran_ids,
                             clock=clock, page_limit=2)
        stopped = await first.refresh(access_token="tok-a", refresh_token=None)
        again = MydataClient(provider, http=http, chain=RefuseNth(None), tran_ids=tran_ids,
                             clock=clock, page_limit=2)
        res = await again.refresh(access_token="tok-a", refresh_token=None,
                                  progress=stopped.progress if resume else None)
    finally:
        await http.aclose()
    return stopped.progress, res.outcome, sim.stats(detail=True)


async def test_a_list_refused_after_page_1_resumes_at_its_cursor_and_is_one_transfer(
        start_sim: StartSim, clock: FakeClock) -> None:
    progress, outcome, stats = await _refresh(start_sim, clock, resume=True)
    assert progress is not None and progress.next_page is not None and len(progress.items) == 2
    assert outcome.kind is Kind.SUCCESS
    bank = stats["providers"]["BANK000001"]
    assert bank["transfers"] == 1 and bank["violations"]["second_transfer"] == 0
    assert stats["consents"]["BANK000001"] == {consent_key("tok-a"): 1}


async def test_starting_the_list_over_would_meet_42901_and_lose_the_week(
        start_sim: StartSim, clock: FakeClock) -> None:
    # What the old client did: the provider counted the transfer on page 1.
    _, outcome, _ = await _refresh(start_sim, clock, resume=False)
    assert outcome.kind is Kind.CONSENT and outcome.rsp_code == "42901"
