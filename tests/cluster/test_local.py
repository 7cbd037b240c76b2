"""Cluster mode's pure parts: the permit stock, the limiter's shared hook, the fall-back to
local limits (FakeClock), the shared allowance's fall-back, merged summaries."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError

from batch.clock import KST, FakeClock
from batch.cluster.allowance import SharedAllowance
from batch.cluster.permits import PermitStock, ServerClock
from batch.cluster.processes import (
    _ended,
    child_argv,
    merge_summaries,
    run_children,
    worst_exit,
)
from batch.cluster.scripts import Scripts
from batch.cluster.session import ClusterOptions, ClusterSession
from batch.cluster.view import cluster_view
from batch.dispatch.summary import COUNTERS, ProviderSummary, RunSummary, SummaryError
from batch.resilience.bulkhead import worker_share
from batch.resilience.chain import ProviderChain
from batch.resilience.limiter import NO_PERMIT, RateLimiter
from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import ChainSettings, LimiterSettings

# -- the stock --------------------------------------------------------------------------


def test_a_stock_hands_out_its_slots_in_order_and_drops_stale_ones() -> None:
    s = PermitStock("BANK000001", rate=10, burst=1, horizon=0.3, stale_after=0.05)
    s.add((0.0, 0.1, 0.2), at=100.0)
    assert s.take(100.0) == 100.0
    assert s.take(100.2) == 100.2  # 100.1 was left unused past stale_after: dropped
    assert s.take(100.2) is None  # empty: never borrowed
    assert s.refused == 0  # not yet: the call waits for the next refill first


async def test_a_call_that_finds_the_stock_empty_waits_for_the_refill_not_refused() -> None:
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, tzinfo=KST))
    s = PermitStock("BANK000001", rate=10, burst=1, horizon=0.3)
    waiter = asyncio.create_task(s.refilled(clock, 1.0))
    await asyncio.sleep(0)
    await clock.run_for(0.1)
    s.add((0.0,), at=clock.monotonic())  # the refill loop, a slice later
    assert await waiter is True
    # none comes in time: one refusal
    late = asyncio.create_task(s.refilled(clock, 1.0))
    await asyncio.sleep(0)
    await clock.run_for(1.5)
    assert await late is False
    assert (s.waited, s.refused) == (2, 1)


async def test_a_chain_call_waits_for_a_late_refill_and_goes_out() -> None:
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, tzinfo=KST))
    chain = ProviderChain("BANK000001", ChainSettings(), clock=clock)
    stock = PermitStock("BANK000001", rate=10, burst=1, horizon=0.3)
    chain.limiter.shared = stock
    sent: list[float] = []

    async def attempt(timeout: float) -> Outcome:
        sent.append(clock.monotonic())
        return Outcome(Kind.SUCCESS, "00000", 200)

    task = asyncio.create_task(chain.call(attempt))
    await asyncio.sleep(0)
    await clock.run_for(0.3)  # the refill is three slices late
    assert not sent
    stock.add((0.0,), at=clock.monotonic())
    await clock.run_for(0.01)
    assert (await task).kind is Kind.SUCCESS
    assert sent == [pytest.approx(0.3, abs=0.02)]
    # no refill at all within PERMIT_WAIT: refused, never sent
    task = asyncio.create_task(chain.call(attempt))
    await asyncio.sleep(0)
    await clock.run_for(2.0)
    assert (await task).kind is Kind.REJECTED and len(sent) == 1


def test_a_stock_asks_for_its_share_or_its_demand_never_more_than_the_horizon() -> None:
    s = PermitStock("BANK000001", rate=30, burst=1, horizon=0.3)
    assert s.want(0.0, live=3) == 4  # ceil(30/s / 3 workers * 0.3 s * 1.2)
    s.add((0.0,) * 4, at=0.0)
    assert s.want(0.0, live=3) == 0  # stocked already
    for _ in range(4):
        assert s.take(0.005) is not None  # within a quarter of the interval (8.3 ms)
    for _ in range(20):  # a burst of demand: refused, and asked for next time
        s.take(0.005)
    assert s.want(0.1, live=3) == 10  # capped at the horizon: 30 * 0.3 + burst


# -- the limiter's hook --------------------------------------------------------------------


class _Shared:
    def __init__(self, slots: list[float | None]) -> None:
        self.slots = slots
        self.throttles: list[float] = []

    def take(self, now: float) -> float | None:
        return self.slots.pop(0)

    def throttled(self, now: float) -> None:
        self.throttles.append(now)


def test_batches_from_slow_and_fast_round_trips_keep_the_servers_spacing() -> None:
    # The server's clock runs 1000 s ahead of ours. Batch 1 comes back over a slow round
    # trip (the server read its time early in it), batch 2 over a fast one. Anchored at
    # each round trip's midpoint, batch 1 would land 40 ms late and bunch into batch 2.
    sc = ServerClock()
    assert sc.sample(sent=10.0, recv=10.002, server_now=1010.001) == pytest.approx(1000.0)
    off = sc.sample(sent=10.100, recv=10.180, server_now=1010.101)  # read at 10.101
    assert off == pytest.approx(1000.0)  # the fast sample still rules
    assert sc.to_local(1010.101) == pytest.approx(10.101, abs=1e-3)
    # a faster round trip refines it; an old best ages out of the window
    assert sc.sample(10.2, 10.2005, 1010.20025) == pytest.approx(1000.0, abs=1e-6)
    assert sc.rtt == pytest.approx(0.0005)
    later = sc.sample(30.0, 30.010, 1030.005)
    assert later == pytest.approx(1000.0) and sc.rtt == pytest.approx(0.010)


def test_a_stepped_server_clock_restarts_the_offset_from_the_new_sample() -> None:
    sc = ServerClock()
    sc.sample(10.0, 10.001, 1010.0005)
    # the server's clock jumped 2 s ahead: the old offset cannot be true any more
    assert sc.sample(11.0, 11.030, 1013.015) == pytest.approx(1002.0, abs=1e-3)
    with pytest.raises(ValueError):
        ServerClock(window=0)
    with pytest.raises(RuntimeError):
        ServerClock().to_local(1.0)


def test_the_local_limiter_waits_for_the_later_of_its_slot_and_the_shared_one() -> None:
    lim = RateLimiter(LimiterSettings(calls_per_second=10))
    lim.shared = _Shared([0.25, 0.0, None])
    assert lim.reserve(0.0, 5.0) == pytest.approx(0.25)  # the shared slot is later
    assert lim.reserve(0.0, 5.0) == pytest.approx(0.1)  # the local one is later
    assert lim.reserve(0.0, 5.0) == NO_PERMIT  # no shared permit: the chain waits
    # a refusal reserved nothing locally: the next local slot is still .2
    lim.shared = None
    assert lim.reserve(0.0, 5.0) == pytest.approx(0.2)


def test_a_42902_lowers_the_shared_rate_too_and_a_share_divides_the_local_one() -> None:
    lim = RateLimiter(LimiterSettings(calls_per_second=12))
    shared = _Shared([])
    lim.shared = shared
    lim.observe(Outcome(Kind.THROTTLED, rsp_code="42902"), 3.0)
    assert shared.throttles == [3.0]
    assert lim.rate(3.0) == pytest.approx(6.0)
    lim.set_share(1 / 3)
    assert lim.base_rate == pytest.approx(4.0)
    assert lim.rate(3.0) == pytest.approx(2.0)  # the back-off still applies
    lim.set_share(1.0)
    assert lim.base_rate == pytest.approx(12.0)
    with pytest.raises(ValueError):
        lim.set_share(0.0)


# -- the session's fall-back (FakeClock) ---------------------------------------------------


def _session(clock: FakeClock, cap: int | None = None
             ) -> tuple[ClusterSession, ProviderChain, ProviderChain]:
    s = ClusterSession(engine=None, clock=clock,  # type: ignore[arg-type]
                       options=ClusterOptions("redis://127.0.0.1:1/0"))
    chains = []
    for org, cps in (("BANK000001", 30.0), ("CARD000001", 9.0)):
        c = ProviderChain(org, ChainSettings(limiter=LimiterSettings(calls_per_second=cps)),
                          clock=clock)
        s.attach(c, cap=cap)
        chains.append(c)
    return s, chains[0], chains[1]


def test_redis_lost_no_local_call_goes_out_before_the_granted_shared_permits_ran_out() -> None:
    """Other workers may still hold shared permits up to a horizon past their grant: the
    first local slot waits out the horizon and one local interval, so the seconds across
    the switch stay within the limit plus its burst (the live test counts them)."""
    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, bank, _card = _session(clock)
    s._live = 3
    clock.advance(100.0)
    s.lost(ConnectionError("Connection refused"))
    now = clock.monotonic()
    interval = 3 / 30.0  # 30 calls/s over 3 workers
    first = bank.limiter.reserve(now, 5.0)
    assert first == pytest.approx(s.options.horizon + interval)
    assert bank.limiter.reserve(now, 5.0) == pytest.approx(first + interval)


def test_redis_lost_each_limiter_runs_alone_at_its_rate_over_the_live_workers(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, bank, card = _session(clock)
    assert bank.limiter.shared is not None and s.shared
    s._live = 3
    s.lost(ConnectionError("Connection refused"))
    assert not s.shared
    assert bank.limiter.shared is None and card.limiter.shared is None
    assert bank.limiter.base_rate == pytest.approx(10.0)
    assert card.limiter.base_rate == pytest.approx(3.0)
    assert any(r.__dict__.get("action") == "shared_limit_lost" for r in caplog.records)
    s.lost(ConnectionError("again"))  # already local: counted once
    assert s.fallbacks == 1
    clock.advance(7.0)
    s._live = 2  # the registry saw a worker die: the share grows
    s._apply_local()
    assert bank.limiter.base_rate == pytest.approx(15.0)
    # ... once the departed worker's last calls are out of the provider's 1-second window
    now = clock.monotonic()
    assert bank.limiter.reserve(now, 5.0) == pytest.approx(1.0 + 1 / 15)
    assert card.limiter.reserve(now, 5.0) == pytest.approx(1.0 + 1 / 4.5)
    s._restore()
    assert s.shared and bank.limiter.base_rate == pytest.approx(30.0)
    assert bank.limiter.shared is s._stocks["BANK000001"]
    rep = s.report()
    assert rep["redis_fallbacks"] == 1 and rep["redis_fallback_seconds"] == 7.0
    assert rep["shared_limit"] == "shared"
    s.lost(ConnectionError("gone again"))
    clock.advance(10.0)
    s._live = 4  # one more live worker: the share shrinks at once, no wait
    s._apply_local()
    assert bank.limiter.base_rate == pytest.approx(7.5)
    assert bank.limiter.reserve(clock.monotonic(), 5.0) == 0.0


@pytest.mark.parametrize("full", [
    MaxConnectionsError("Too many connections"),  # redis-py 6 and later
    RedisConnectionError("Too many connections"),  # before it
])
def test_our_own_full_connection_pool_is_not_redis_lost(
        full: Exception, caplog: pytest.LogCaptureFixture) -> None:
    """The other workers still have Redis and its shared rate: this one going local beside
    them would send its share on top of the whole rate (a 2-worker bench saw 136/s at 100/s
    when a burst of refunds filled the pool)."""
    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, bank, _card = _session(clock)
    s._live = 2
    s.lost(full)
    s.lost(full)
    assert s.shared and bank.limiter.shared is s._stocks["BANK000001"]
    assert bank.limiter.base_rate == pytest.approx(30.0)
    rep = s.report()
    assert rep["redis_fallbacks"] == 0 and rep["redis_pool_full"] == 2
    assert [r.__dict__.get("action") for r in caplog.records].count("redis_pool_full") == 1
    s.lost(RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."))
    assert not s.shared and s.fallbacks == 1  # Redis itself gone: the local share


def _nodes(n: int, first: int = 1) -> list[SimpleNamespace]:
    """Live workers as the registry lists them (only what the session reads)."""
    return [SimpleNamespace(node_id=first + i) for i in range(n)]


async def test_a_workers_lane_of_the_shared_slots_is_its_place_among_the_live(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from batch.cluster import registry

    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, _, _ = _session(clock)
    s.node_id = 7
    live = [SimpleNamespace(node_id=i) for i in (9, 3, 7)]

    async def workers(engine: object, *, now: datetime) -> list[SimpleNamespace]:
        return live

    monkeypatch.setattr(registry, "live_workers", workers)
    await s._refresh_live()
    assert (s._lane, s._live) == (1, 3)  # 3, 7, 9: the second
    live = [SimpleNamespace(node_id=i) for i in (3, 9)]  # not listed yet (a late beat)
    await s._refresh_live()
    assert (s._lane, s._live) == (1, 2)  # 7 mod 2: a lane shared for a beat, still exact


async def test_each_worker_holds_its_share_of_a_providers_concurrency(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from batch.cluster import registry

    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, bank, _ = _session(clock)
    assert bank.bulkhead.limit == 20  # one worker: the provider's max_concurrency
    live = _nodes(3)

    async def workers(engine: object, *, now: datetime) -> list[SimpleNamespace]:
        return live

    monkeypatch.setattr(registry, "live_workers", workers)
    await s._refresh_live()
    assert bank.bulkhead.limit == 6  # 3 workers x 6 <= 20 in flight at the provider
    live = _nodes(40)
    await s._refresh_live()
    assert bank.bulkhead.limit == 1  # never none
    live = _nodes(2)
    await s._refresh_live()
    assert bank.bulkhead.limit == 10


async def test_a_workers_own_cap_bounds_its_share_and_the_share_bounds_the_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from batch.cluster import registry

    clock = FakeClock(datetime(2026, 11, 30, tzinfo=UTC))
    s, bank, _ = _session(clock, cap=8)  # run --concurrency 8
    assert bank.bulkhead.limit == 8  # one worker: 20 allowed, 8 is what it is sized for
    live = _nodes(2)

    async def workers(engine: object, *, now: datetime) -> list[SimpleNamespace]:
        return live

    monkeypatch.setattr(registry, "live_workers", workers)
    await s._refresh_live()
    assert bank.bulkhead.limit == 8  # 2 x 8 <= 20: the cap still binds, not the provider
    live = _nodes(3)
    await s._refresh_live()
    assert bank.bulkhead.limit == 6  # 3 x 8 > 20: the provider's share binds


def test_worker_share_is_the_lower_of_the_share_and_the_cap_and_never_zero() -> None:
    assert worker_share(20, 1) == 20
    assert worker_share(20, 3) == 6
    assert worker_share(20, 40) == 1
    assert worker_share(20, 1, cap=8) == 8
    assert worker_share(20, 4, cap=8) == 5
    assert worker_share(20, 0, cap=50) == 20  # no live worker seen yet: counted as one


# -- the allowance without Redis -----------------------------------------------------------


class _Link:
    def __init__(self, live: int, shared: bool) -> None:
        self._live = live
        self.shared = shared
        self.errors: list[BaseException] = []

    def live(self) -> int:
        return self._live

    def lost(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.shared = False


class _Broken:
    async def grant(self, *a: Any, **kw: Any) -> int:
        raise ConnectionError("Redis gone")


async def test_without_redis_a_worker_grants_itself_its_share_of_the_minute() -> None:
    link = _Link(live=3, shared=True)
    a = SharedAllowance("BANK000001", scripts=_Broken(),  # type: ignore[arg-type]
                        link=link, day="2026-11-30", quota=1000, seed=0)
    got = [await a.take(60, due, 3, 100) for due in (3, 6, 9, 12, 15, 18)]
    assert link.errors and not link.shared
    assert sum(got) == 6  # 18 due in the minute so far, a third of it ours
    assert got[0] == 1
    # a new minute starts its own share
    assert await a.take(61, 3, 3, 100) == 1


async def test_a_worker_asks_for_its_share_plus_what_it_was_not_granted() -> None:
    asks: list[int] = []

    class _Stingy:
        async def grant(self, org: str, *, want: int, **kw: Any) -> int:
            asks.append(want)
            return 0 if len(asks) < 3 else want

    a = SharedAllowance("BANK000001", scripts=_Stingy(),  # type: ignore[arg-type]
                        link=_Link(live=2, shared=True), day="d", quota=10**6, seed=0)
    for due in (4, 8, 12):
        await a.take(60, due, 4, 100)
    assert asks == [2, 4, 6]  # a dead worker's share is taken up as the carry grows


# -- summaries -----------------------------------------------------------------------------


def _prov(org: str, **c: int) -> ProviderSummary:
    return ProviderSummary(org_code=org, counters={k: c.get(k, 0) for k in COUNTERS},
                           by_outcome={"success": c.get("succeeded", 0)},
                           calls_per_second=1.5, breaker="closed")


def _run(run_id: str, code: int, *provs: ProviderSummary, status: str = "done") -> RunSummary:
    return RunSummary(run_id=run_id, date="2026-11-30", week_start="2026-11-29",
                      worker_id="w", status=status, exit_code=code, elapsed_seconds=10.0,
                      providers=provs)


def test_the_merged_exit_code_is_the_one_that_matters_most() -> None:
    assert worst_exit([0, 0]) == 0
    assert worst_exit([0, 3]) == 3
    assert worst_exit([3, 1, 0]) == 1
    assert worst_exit([1, 2]) == 2
    assert worst_exit([0, -9]) == 1  # a killed child: work an operator must see


def test_summaries_of_workers_merge_into_one() -> None:
    a = _run("r1", 0, _prov("BANK000001", planned=100, attempted=40, succeeded=40, calls=80))
    b = _run("r2", 1, _prov("BANK000001", planned=100, attempted=60, succeeded=59, failed=1,
                            deferred=3, calls=120), status="incomplete")
    m = merge_summaries([a, b], worker_id="host-1")
    p = m.provider("BANK000001")
    assert p.counters["planned"] == 100  # the shared plan, not twice it
    assert (p.counters["attempted"], p.counters["succeeded"], p.counters["calls"]) == (
        100, 99, 200)
    assert p.counters["deferred"] == 0  # counted cluster-wide by each: the latest view
    assert p.calls_per_second == 3.0
    assert (m.exit_code, m.status, m.run_id) == (1, "incomplete", "r1+r2")


@pytest.mark.parametrize("states, shown", [
    (("cluster_closed", "cluster_open", "closed"), "cluster_open"),
    (("metrics_only", "cluster_closed"), "cluster_closed"),
    (("half_open", "cluster_forced_open"), "cluster_forced_open"),
    (("closed", "cluster_forced_closed"), "cluster_forced_closed"),
])
def test_the_merged_breaker_column_is_the_most_severe_workers(
        states: tuple[str, ...], shown: str) -> None:
    parts = [_run(f"r{i}", 0, replace(_prov("BANK000001"), breaker=b))
             for i, b in enumerate(states)]
    assert merge_summaries(parts, worker_id="h").provider("BANK000001").breaker == shown


def test_a_worker_process_without_a_summary_is_named_with_how_it_ended(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="mydata.cluster")
    with pytest.raises(SummaryError, match=r"no worker process printed a summary \(exit "
                                           r"codes \[2, 2\]\)"):
        run_children(["--db", str(tmp_path / "missing.db"), "run"], 2, worker_id="box")
    lines = sorted(r.getMessage() for r in caplog.records
                   if r.__dict__.get("action") == "worker_process_failed")
    assert [line.split(":")[0] for line in lines] == [
        "worker process box-p0 exited 2 and printed no summary",
        "worker process box-p1 exited 2 and printed no summary"]
    assert _ended(-9) == "was killed by SIGKILL" and _ended(-99) == "was killed by signal 99"


def test_child_command_lines_drop_processes_and_name_each_worker() -> None:
    argv = ["--db", "x", "run", "--processes", "3", "--only", "B", "--processes=2"]
    assert child_argv(argv, 1, "h-9") == ["--db", "x", "run", "--only", "B", "--json",
                                          "--worker-id", "h-9-p1", "--process-index", "1"]


def test_deferred_is_judged_cluster_wide_at_a_workers_end() -> None:
    s = _run("r1", 1, _prov("BANK000001", planned=100, attempted=30, succeeded=30,
                            deferred=70), status="incomplete")
    done = cluster_view(s, attempted={"BANK000001": 95}, held={"BANK000001": 5},
                        report={"node_id": 4})
    assert done.provider("BANK000001").counters["deferred"] == 0
    assert (done.exit_code, done.status) == (0, "done")
    assert done.provider("BANK000001").extra["cluster"] == {"node_id": 4}
    short = cluster_view(s, attempted={"BANK000001": 90}, held={}, report={})
    assert short.provider("BANK000001").counters["deferred"] == 10
    assert (short.exit_code, short.status) == (1, "incomplete")
    # two workers still running: the 10 nobody holds (a dead worker's claims just came
    # back) are theirs to claim; the last worker to stop judges the day
    theirs = cluster_view(s, attempted={"BANK000001": 90}, held={}, report={}, others_live=2)
    p = theirs.provider("BANK000001")
    assert p.counters["deferred"] == 0 and (theirs.exit_code, theirs.status) == (0, "done")
    assert p.extra["cluster"] == {"left_to_live_workers": 10, "others_live": 2}


def test_deferred_cluster_wide_is_no_more_than_what_is_still_due() -> None:
    s = _run("r1", 1, _prov("BANK000001", planned=100, attempted=30, succeeded=30,
                            deferred=70), status="incomplete")
    # 10 left by the count, but 7 of them revoked meanwhile: 3 are still due
    capped = cluster_view(s, attempted={"BANK000001": 90}, held={}, report={},
                          due={"BANK000001": 3})
    p = capped.provider("BANK000001")
    assert (p.counters["deferred"], p.extra["no_longer_due"]) == (3, 7)
    # all 10 revoked: not deferred, and the day is done; a provider the count did not
    # ask about (nothing left of its day) has none still due
    gone = cluster_view(s, attempted={"BANK000001": 90}, held={}, report={}, due={})
    p = gone.provider("BANK000001")
    assert (p.counters["deferred"], p.extra["no_longer_due"]) == (0, 10)
    assert (gone.exit_code, gone.status) == (0, "done")
    # still due but in the hands of live workers: theirs, and none of it gone
    theirs = cluster_view(s, attempted={"BANK000001": 90}, held={}, report={},
                          due={"BANK000001": 10}, others_live=1)
    p = theirs.provider("BANK000001")
    assert (p.counters["deferred"], p.extra["no_longer_due"]) == (0, 0)
    assert p.extra["cluster"]["left_to_live_workers"] == 10
    # merged: the worker that stopped last saw the most of it gone
    first, last = (replace(s, providers=(replace(
        s.providers[0], extra={"no_longer_due": n}),)) for n in (0, 7))
    merged = merge_summaries([first, last], worker_id="h").provider("BANK000001")
    assert merged.extra["no_longer_due"] == 7


def test_scripts_refuse_a_bad_speed() -> None:
    with pytest.raises(ValueError):
        Scripts(None, speed=0)  # type: ignore[arg-type]
