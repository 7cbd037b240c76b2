"""The cluster's Lua scripts against the real Redis (db 15, flushed by the fixture)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest
from redis.asyncio import Redis

from batch.cluster.allowance import SharedAllowance
from batch.cluster.scripts import Granted, Keys, RateAsk, Scripts


@pytest.fixture
async def scripts(redis_url: str) -> AsyncIterator[Scripts]:
    client = Redis.from_url(redis_url)
    try:
        yield Scripts(client, keys=Keys(f"t{uuid.uuid4().hex[:8]}"), speed=1.0)
    finally:
        await client.aclose()


def _ask(n: int, *, rate: float = 10.0, burst: int = 1, horizon: float = 0.35) -> RateAsk:
    return RateAsk("BANK000001", rate, burst, n, horizon, 60.0)


async def test_permits_are_spaced_by_the_rate_and_bounded_by_the_horizon(
        scripts: Scripts) -> None:
    (g,) = await scripts.permits([_ask(10)])
    assert g.factor == 1.0
    # 10 calls/s, no burst: slots 0, .1, .2, .3 from the server's now; .4 is past .35
    assert len(g.offsets) == 4
    gaps = [b - a for a, b in zip(g.offsets, g.offsets[1:], strict=False)]
    assert all(abs(d - 0.1) < 1e-6 for d in gaps)
    assert g.offsets[0] == pytest.approx(0.0, abs=1e-6)
    # the next ask continues after the last slot handed out: no slot is given twice
    (h,) = await scripts.permits([_ask(10, horizon=1.0)])
    assert h.offsets[0] >= 0.4 - 0.05
    assert len(h.offsets) <= 7


async def test_a_burst_lets_that_many_go_at_once(scripts: Scripts) -> None:
    (g,) = await scripts.permits([_ask(5, burst=3, horizon=0.15)])
    assert g.offsets[:3] == pytest.approx((0.0, 0.0, 0.0), abs=1e-3)
    assert len(g.offsets) == 4  # the fourth at ~.1


async def test_two_workers_share_one_rate(scripts: Scripts) -> None:
    a, b = await scripts.permits([_ask(20, horizon=0.95), _ask(20, horizon=0.95)])
    # together never more than a second's worth: 10 calls/s over [0, .95] is 10 slots
    assert len(a.offsets) + len(b.offsets) == 10


async def test_a_42902_anywhere_halves_the_rate_for_everyone_once_per_gap(
        scripts: Scripts) -> None:
    low = await scripts.throttle("BANK000001", factor=0.5, floor=0.1, hold=30, gap=1.0,
                                 recovery=60)
    assert low == 0.5
    again = await scripts.throttle("BANK000001", factor=0.5, floor=0.1, hold=30, gap=1.0,
                                   recovery=60)
    assert again == 0.5  # answers to calls already in flight do not lower it again
    (g,) = await scripts.permits([_ask(10, horizon=0.5)])
    assert g.factor == 0.5
    gaps = [b - a for a, b in zip(g.offsets, g.offsets[1:], strict=False)]
    assert gaps and all(abs(d - 0.2) < 1e-6 for d in gaps)


async def test_the_scaled_clock_of_a_test_scales_the_servers_time(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        fast = Scripts(client, keys=Keys(f"t{uuid.uuid4().hex[:8]}"), speed=10.0)
        (g,) = await fast.permits([_ask(3, horizon=1.0)])
        # offsets in clock seconds: still .1 apart at 10 calls per (scaled) second
        assert [round(b - a, 6) for a, b in zip(g.offsets, g.offsets[1:], strict=False)] == [
            0.1, 0.1]
    finally:
        await client.aclose()


async def test_grants_stop_at_the_minutes_target_so_far_and_at_the_days_quota(
        scripts: Scripts) -> None:
    kw = {"day": "2026-11-30", "minute": 60, "quota": 25, "seed": 10}
    assert await scripts.grant("BANK000001", want=4, due=3, **kw) == 3
    assert await scripts.grant("BANK000001", want=4, due=3, **kw) == 0  # another worker
    assert await scripts.grant("BANK000001", want=4, due=6, **kw) == 3
    # the day: seeded with 10 attempts, 6 granted, 25 in all: 9 left
    assert await scripts.grant("BANK000001", want=50, due=100, **kw) == 9
    assert await scripts.grant("BANK000001", want=5, due=100,
                               **{**kw, "minute": 61}) == 0
    await scripts.refund("BANK000001", day="2026-11-30", n=2)
    assert await scripts.grant("BANK000001", want=5, due=100, **{**kw, "minute": 61}) == 2


async def test_a_dead_runs_unused_grants_come_back_to_the_day_once(scripts: Scripts) -> None:
    kw = {"day": "2026-11-30", "quota": 20, "seed": 0}
    assert await scripts.grant("BANK000001", minute=60, want=8, due=8, member="dead",
                               **kw) == 8
    assert await scripts.grant("BANK000001", minute=60, want=12, due=20, member="live",
                               **kw) == 12
    await scripts.refund("BANK000001", day="2026-11-30", n=1, member="dead")
    # the day is used up; the dead run wrote 5 outcomes of its 7 (8 granted, 1 given back)
    assert await scripts.grant("BANK000001", minute=61, want=5, due=5, member="live",
                               **kw) == 1
    assert await scripts.reclaim("BANK000001", day="2026-11-30", member="dead", used=5) == 2
    assert await scripts.reclaim("BANK000001", day="2026-11-30", member="dead", used=5) == 0
    assert await scripts.grant("BANK000001", minute=61, want=5, due=5, member="live",
                               **kw) == 2
    # a run that accounted for all it was granted gives nothing back
    assert await scripts.reclaim("BANK000001", day="2026-11-30", member="live", used=15) == 0


def _lane(n: int, lane: int, lanes: int, *, rate: float = 100.0,
          horizon: float = 0.3) -> RateAsk:
    return RateAsk("BANK000001", rate, 1, n, horizon, 60.0, lane=lane, lanes=lanes)


def _times(g: Granted) -> list[float]:
    return [g.server_now + o for o in g.offsets]


def _spaced(times: list[float], gap: float) -> bool:
    t = sorted(times)
    return all(b - a >= gap - 1e-6 for a, b in pairwise(t))


async def test_two_lanes_over_asking_each_get_slots_spread_over_the_horizon(
        scripts: Scripts) -> None:
    """Both workers ask for more than the horizon holds, round after round: with one tat
    the newest stretch went whole to the first to ask; in lanes each gets every other
    slot of it, and the two together never two slots closer than the rate's interval."""
    got: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(4):
        a, b = await scripts.permits([_lane(100, 0, 2), _lane(100, 1, 2)])
        got[0] += _times(a)
        got[1] += _times(b)
    assert _spaced(got[0] + got[1], 0.01)  # 100 calls/s cluster-wide
    for mine in got.values():
        assert 10 <= len(mine) <= 16  # a half of 0.3 s of slots each (and a little more)
        assert _spaced(mine, 0.02)  # every other point of the lattice
        t = sorted(mine)
        assert max(b - a for a, b in pairwise(t)) < 0.03  # no stretch out


async def test_a_new_lattice_starts_after_every_slot_handed_out(scripts: Scripts) -> None:
    """A worker joins (2 lanes -> 3), leaves (-> 1), the back-off halves the rate: no slot
    of the new lattice lands closer than the interval to one handed out before it."""
    seen: list[float] = []
    for lanes in (2, 3, 1, 2):
        gs = await scripts.permits([_lane(100, j, lanes) for j in range(lanes)])
        seen += [t for g in gs for t in _times(g)]
        assert _spaced(seen, 0.01), lanes
    await scripts.throttle("BANK000001", factor=0.5, floor=0.1, hold=30, gap=1.0,
                           recovery=60)
    gs = await scripts.permits([_lane(100, j, 2, horizon=1.0) for j in range(2)])
    new = [t for g in gs for t in _times(g)]
    assert new and gs[0].factor == 0.5 and _spaced(new, 0.02)  # 50 calls/s now
    assert min(new) >= max(seen) + 0.01 - 1e-6


async def test_a_lane_past_the_count_shares_one_and_stays_exact(scripts: Scripts) -> None:
    """Two workers that see the registry differently for a beat (one thinks it is lane 2
    of 2): they share a lane, never a slot."""
    a, b = await scripts.permits([_lane(100, 0, 2), _lane(100, 2, 2)])
    assert _spaced(_times(a) + _times(b), 0.02)


class _Link:
    """The session's side of an allowance: Redis shared until a round trip fails."""

    def __init__(self) -> None:
        self.shared = True
        self.errors: list[BaseException] = []

    def live(self) -> int:
        return 2

    def lost(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.shared = False


async def test_a_slices_refused_calls_give_their_starts_back_without_emptying_the_pool(
        scripts: Scripts) -> None:
    """A binding rate: a worker's waiters without permits are refused together, each start
    given back (NotAttempted). A round trip each was a connection each: past the client's
    pool (redis-py's 100) MaxConnectionsError, taken for Redis lost, and the worker ran on
    its local share beside the others' shared permits (2 workers at 100/s: 136/s)."""
    day = "2026-11-30"
    assert await scripts.grant("BANK000001", day=day, minute=60, want=300, due=300,
                               quota=1000, seed=0) == 300
    link = _Link()
    a = SharedAllowance("BANK000001", scripts=scripts, link=link, day=day, quota=1000,
                        seed=0)
    await a.take(60, 300, 0, 0)  # the minute the starts were granted in
    for _ in range(300):
        a.refund(1)
    while a._refunds:
        await asyncio.gather(*a._refunds)
    assert link.errors == [] and link.shared
    assert await scripts.day_used("BANK000001", day=day, seed=0) == 0  # all 300 back


class _FailingGrants:
    """Scripts whose grant round trip fails (a full pool, or Redis gone)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def grant(self, *_: object, **__: object) -> int:
        raise self.exc


class _PoolFullLink(_Link):
    """The session's view when its own pool was full: Redis is not lost."""

    def lost(self, exc: BaseException) -> None:
        self.errors.append(exc)


async def test_a_grant_that_fails_while_redis_is_still_shared_grants_nothing_locally() -> None:
    """Only a lost Redis makes a worker start its share of the minute on its own: a round
    trip that failed on this worker's full pool leaves the minute to the cluster's count
    (nothing this slice, the starts still pending for the next)."""
    full = _PoolFullLink()
    a = SharedAllowance("BANK000001", scripts=_FailingGrants(  # type: ignore[arg-type]
        ConnectionError("Too many connections")), link=full, day="2026-11-30", quota=100,
        seed=0)
    assert await a.take(60, 10, 10, 10) == 0 and a.local_granted == 0
    lost = _Link()
    b = SharedAllowance("BANK000001", scripts=_FailingGrants(  # type: ignore[arg-type]
        ConnectionError("refused")), link=lost, day="2026-11-30", quota=100, seed=0)
    assert await b.take(60, 10, 10, 10) == 5 and b.local_granted == 5  # its half of 10
