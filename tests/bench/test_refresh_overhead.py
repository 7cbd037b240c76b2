"""One consent's refresh, our path against (a3), over an in-process transport: our own
CPU a refresh, with the network and the other processes out of the figure.

Run: ``pytest -s tests/bench/test_refresh_overhead.py``. Both rows send through the same
``MydataClient`` (its request building, transport call, response reading and
classification) to a transport that answers at once with canned bytes, one list page and
one detail call a refresh, as the dispatch benchmark's simulator does:

(a3) ``MydataClient.refresh`` with a pass-through chain and a token in the clear: the
     dispatch benchmark's (a3), the floor of our HTTP layer;
(full) what the dispatcher runs for a claim (``runner._refresher``): the stored access
     token opened (AES-GCM) on its row, the refresh token left sealed unless a 40101 needs
     it, every call through the provider's whole chain (breaker, retry, limiter, bulkhead,
     timeout) with the run's listeners (the metrics recorder and the event log).

What the dispatcher adds around a refresh (its task, the outcome's decision and write) and
what the simulator's answers cost are not here: ``test_dispatch_throughput.py`` runs them.
The rows are interleaved, rounds of ``REFRESH_BENCH_N`` refreshes each, CPU time of this
process (``time.process_time``); medians printed, with our part (full - a3) a refresh and
the ratio (a3) / (full) (the dispatch benchmark's goal of 0.8x, as cost). Nothing asserted
about the times.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import date

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

from batch.client import MydataClient, RefreshResult, make_http_client
from batch.clock import SystemClock
from batch.db import work
from batch.dispatch.runner import _refresher
from batch.observe.logbook import EventLog
from batch.observe.recorder import ChainRecorder
from batch.resilience.chain import ProviderChain
from batch.resilience.settings import ChainSettings
from batch.tranid import TranIdGenerator
from tests.batch.test_client import INSTS, PassThrough
from tests.sealing import CIPHER, seal

N = int(os.environ.get("REFRESH_BENCH_N", "3000"))
ROUNDS = int(os.environ.get("REFRESH_BENCH_ROUNDS", "7"))
CONSENTS = 200
WEEK = date(2026, 11, 29)
_JSON = [(b"content-type", b"application/json")]
_LIST = httpx.Response(200, json={"rsp_code": "00000", "account_cnt": 1, "account_list": [
    {"account_num": "A0", "account_type": "1001", "is_consent": True, "seqno": "1",
     "is_foreign_deposit": False, "prod_name": "x", "is_minus": False,
     "account_status": "01"}]}).content
_DETAIL = httpx.Response(200, json={"rsp_code": "00000", "balance_amt": 1}).content


class Canned(httpx.AsyncBaseTransport):
    """Answers every list call with one account and every detail call with its balance,
    after one turn of the event loop (as a real answer arrives on a later turn)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0)
        return httpx.Response(200, headers=_JSON,
                              content=_LIST if request.method == "GET" else _DETAIL)


async def _bench() -> dict[str, list[float]]:
    # The provider's own limits out of the way: the chain's work is measured, not its waits.
    p = dataclasses.replace(INSTS.providers[0], calls_per_second=1e6, max_concurrency=100)
    clock = SystemClock()
    tran_ids = TranIdGenerator("OPERATOR01", node_id=7)
    http = make_http_client(transport=Canned())
    recorder = ChainRecorder()
    recorder.track(p.org_code, max_attempts=3)
    chain = ProviderChain(p.org_code, ChainSettings.from_provider(p), clock=clock,
                          listeners=[recorder, EventLog(clock=clock)])
    full_client = MydataClient(p, http=http, chain=chain, tran_ids=tran_ids, clock=clock)
    a3_client = MydataClient(p, http=http, chain=PassThrough(), tran_ids=tran_ids,
                             clock=clock)
    engine = create_async_engine("sqlite+aiosqlite://")  # the store only opens tokens here
    store = work.SqlWorkStore(engine, CIPHER)
    claims = [work.Claim(i, p.org_code, f"u{i}", WEEK, 0, 0, False,
                         seal(f"at{i}", p.org_code, f"u{i}"),
                         seal(f"rt{i}", p.org_code, f"u{i}", "refresh_token"))
              for i in range(CONSENTS)]
    refresh = _refresher(full_client, store)

    async def a3(k: int) -> RefreshResult:
        return await a3_client.refresh(access_token=f"at{k}", refresh_token=f"rt{k}")

    async def full(k: int) -> RefreshResult:
        r: RefreshResult = await refresh(claims[k % CONSENTS], None)
        return r

    rows: dict[str, Callable[[int], Awaitable[RefreshResult]]] = {"a3": a3, "full": full}
    out: dict[str, list[float]] = {name: [] for name in rows}
    try:
        for _ in range(ROUNDS):
            for name, one in rows.items():
                gc.collect()
                t = time.process_time()
                for k in range(N):
                    res = await one(k)
                out[name].append((time.process_time() - t) / N * 1e6)
                # sanity, not timing: each row really refreshed (list + detail)
                assert res.outcome.ok and res.calls == 2, res
    finally:
        await http.aclose()
        await engine.dispose()
    assert recorder.providers[p.org_code].by_kind["success"] == ROUNDS * N * 2
    return out


def test_refresh_cost_ours_against_a3() -> None:
    us = asyncio.run(_bench())
    a3, full = (statistics.median(us[k]) for k in ("a3", "full"))
    print(f"\n== one refresh (list + detail) over an in-process transport, CPU us, median of "
          f"{ROUNDS} interleaved rounds of {N} ==")
    for key, label in (("a3", "(a3) pass-through chain, token in the clear"),
                       ("full", "(full) token opened, whole chain, listeners")):
        print(f"{label:<46}{statistics.median(us[key]):>9.1f} us  (rounds "
              f"{min(us[key]):.1f}-{max(us[key]):.1f})")
    print(f"ours a refresh (full - a3): {full - a3:.1f} us = {(full - a3) / 2:.1f} us a call; "
          f"(a3) / (full) = {a3 / full:.2f}x")
