"""The cluster circuit's scripts against the real Redis (db 15, flushed per test): counts in
server-time buckets, the election and its fencing, the coordinator's decisions reaching a
worker's view, probe reservations, operator overrides."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from batch.clock import SystemClock
from batch.cluster.circuit import CircuitSettings, CircuitState, Counts, Forced, ViewMode
from batch.cluster.circuit_redis import CircuitStore
from batch.cluster.circuit_view import CircuitView
from batch.cluster.coordinator import Coordinator

pytestmark = pytest.mark.integration

S = CircuitSettings(window_seconds=10, bucket_seconds=1, minimum_calls=5, healthy_period=3,
                    probe_minimum=2, probe_rate=2.0, lease_ttl=5, coordinator_interval=1,
                    coordinator_stale_after=5, keep_last_for=30)
ORG, OTHER = "BANK000001", "CARD000001"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    try:
        yield r
    finally:
        await r.aclose()


def store(r: Redis, settings: CircuitSettings = S) -> CircuitStore:
    return CircuitStore(r, settings=settings, prefix="t:circuit:")


async def test_pushed_counts_land_in_the_server_time_bucket_and_add_up(redis: Redis) -> None:
    s = store(redis)
    b1 = await s.push({ORG: Counts(3, 1, 0), OTHER: Counts(0, 2, 2)})
    b2 = await s.push({ORG: Counts(1, 1, 1)})
    t = await s.server_time()
    assert b1 <= b2 <= t < b2 + 1
    snap = await s.read_snapshot()
    assert abs(snap.now - t) < 5
    total = Counts()
    for c in snap.buckets[ORG].values():
        total = total + c
    assert total == Counts(4, 2, 1)
    assert sum(snap.buckets[OTHER].values(), Counts()) == Counts(0, 2, 2)
    ttl = await redis.ttl(f"t:circuit:counts:{b2}")
    assert 10 < ttl <= int(S.history_seconds + 3 * S.bucket_seconds + 60)


async def test_one_leader_at_a_time_and_a_new_generation_on_each_election(
        redis: Redis) -> None:
    s = store(redis)
    gen_a, tok_a = await s.acquire("a")
    assert (gen_a, tok_a) == (1, "1:a")
    assert await s.acquire("b") == (0, "1:a")
    pttl = await redis.pttl("t:circuit:leader")
    assert 0 < pttl <= 5000
    await redis.delete("t:circuit:leader")  # the lease expired (a's process paused)
    assert await s.acquire("b") == (2, "2:b")


async def test_a_paused_ex_leader_cannot_write(redis: Redis) -> None:
    s = store(redis)
    _, tok_a = await s.acquire("a")
    from batch.cluster.circuit import ProviderCircuit
    assert await s.write(tok_a, 1, [ProviderCircuit(ORG, CircuitState.OPEN, 1.0, "a's")])
    await redis.delete("t:circuit:leader")  # a paused past its lease ...
    _, tok_b = await s.acquire("b")  # ... and b took over
    assert not await s.write(tok_a, 1, [ProviderCircuit(ORG, CircuitState.CLOSED, 2.0,
                                                         "stale")])
    snap = await s.read_snapshot()
    assert snap.states[ORG].reason == "a's"
    assert snap.leader == tok_b
    # nor after the lease simply lapsed with nobody taking over
    await redis.delete("t:circuit:leader")
    assert not await s.write(tok_b, 2, [])
    assert not await s.release(tok_a)


async def test_the_write_renews_the_lease_and_beats_with_the_server_time(
        redis: Redis) -> None:
    s = store(redis)
    _, tok = await s.acquire("a")
    await redis.pexpire("t:circuit:leader", 100)
    assert await s.write(tok, 1, [])
    assert await redis.pttl("t:circuit:leader") > 1000
    beat = json.loads(await redis.get("t:circuit:beat"))
    assert beat["leader"] == "a" and beat["generation"] == 1
    assert abs(beat["at"] - await s.server_time()) < 5


async def test_coordinator_opens_from_cluster_counts_and_the_view_sees_it(
        redis: Redis) -> None:
    s = store(redis)
    clock = SystemClock()
    a = Coordinator(s, candidate_id="a", clock=clock)
    b = Coordinator(store(redis), candidate_id="b", clock=clock)
    view = CircuitView(store(redis), worker_id="w", clock=clock)
    assert await view.refresh() is ViewMode.LOCAL  # no coordinator beat yet
    assert await a.tick()
    assert not await b.tick()
    assert a.is_leader and not b.is_leader
    assert await view.refresh() is ViewMode.CLUSTER
    assert not view.is_open(ORG)
    # each worker sees 2 failures of 3: none alone has the minimum, the cluster has
    for _ in range(3):
        await s.push({ORG: Counts(1, 2, 0), OTHER: Counts(3, 0, 0)})
    assert await a.tick()
    await view.refresh()
    assert view.is_open(ORG)
    assert not view.is_open(OTHER)
    st = view.status()
    assert st["mode"] == "cluster"
    opened = st["open"]
    assert isinstance(opened, dict)
    assert "failure rate 67% of 9 calls" in opened[ORG]["reason"]


async def test_another_candidate_takes_over_and_keeps_the_open_state(redis: Redis) -> None:
    s = store(redis)
    clock = SystemClock()
    a = Coordinator(s, candidate_id="a", clock=clock)
    b = Coordinator(store(redis), candidate_id="b", clock=clock)
    await a.tick()
    await s.push({ORG: Counts(0, 10, 0)})
    await a.tick()
    since = (await s.read_snapshot()).states[ORG].since
    await redis.delete("t:circuit:leader")  # a died: its lease ran out
    assert await b.tick()
    assert b.generation == 2
    snap = await s.read_snapshot()
    assert snap.states[ORG].state is CircuitState.OPEN
    assert snap.states[ORG].since == since
    assert snap.states[ORG].generation == 2
    assert not await a.tick()  # a wakes up: fenced, and it knows it
    assert not a.is_leader


async def test_probe_reservations_are_spaced_cluster_wide(redis: Redis) -> None:
    s1, s2 = store(redis), store(redis)
    assert await s1.reserve_probe(ORG, "w1")
    assert not await s2.reserve_probe(ORG, "w2")
    assert await s2.reserve_probe(OTHER, "w2")  # per provider
    pttl = await redis.pttl(f"t:circuit:probe:{ORG}")
    assert 0 < pttl <= 500  # 2 probes a second: one reservation per 500 ms
    await asyncio.sleep(0.6)  # the reservation has expired (this only waits longer)
    assert await s2.reserve_probe(ORG, "w2")


async def test_forced_states_reach_workers_and_the_coordinator_respects_them(
        redis: Redis) -> None:
    s = store(redis)
    clock = SystemClock()
    a = Coordinator(s, candidate_id="a", clock=clock)
    view = CircuitView(store(redis), worker_id="w", clock=clock)
    await a.tick()
    now = await s.server_time()
    await s.force(ORG, Forced(CircuitState.FORCED_OPEN, "maintenance", now, "kim"))
    await s.force(OTHER, Forced(CircuitState.FORCED_CLOSED, "known noise", now, "kim"))
    await s.push({OTHER: Counts(0, 50, 0)})
    await view.refresh()
    assert view.is_open(ORG) and not view.is_open(OTHER)  # before the coordinator ran
    await a.tick()
    snap = await s.read_snapshot()
    assert snap.states[ORG].state is CircuitState.FORCED_OPEN
    assert snap.states[OTHER].state is CircuitState.FORCED_CLOSED
    assert snap.states[ORG].reason == "forced by kim: maintenance"
    assert await s.release_force(OTHER)
    await a.tick()
    await view.refresh()
    assert view.state(OTHER) is CircuitState.CLOSED  # released: closed afresh ...
    await a.tick()
    await view.refresh()
    assert view.is_open(OTHER)  # ... and judged on its counts again


async def test_a_clean_stop_releases_the_lease_for_an_immediate_takeover(
        redis: Redis) -> None:
    s = store(redis)
    a = Coordinator(s, candidate_id="a", clock=SystemClock())
    await a.tick()
    await a.resign()
    assert await redis.get("t:circuit:leader") is None
    assert (await s.acquire("b"))[0] == 2


async def test_a_node_started_alone_leads_and_follows_the_list_at_once(redis: Redis) -> None:
    from batch.cluster.circuit_node import CircuitNode

    node = CircuitNode(redis, worker_id="w1", clock=SystemClock(), settings=S,
                       prefix="t:circuit:")
    await node.start()
    try:
        assert node.coordinator is not None and node.coordinator.is_leader
        st = node.status()
        assert (st["mode"], st["leader"], st["coordinator"]) == ("cluster", True, "1:w1")
    finally:
        await node.stop()
    assert await redis.get("t:circuit:leader") is None  # a clean stop gives the lease back


async def test_a_scaled_cluster_clock_reads_server_time_times_its_speed(redis: Redis) -> None:
    """A test's scaled clock (speed 4): buckets, the snapshot and the beat are on the cluster
    clock (TIME x 4), and expiries are the settings' seconds / 4 on the server."""
    s = CircuitStore(redis, settings=S, prefix="t:circuit:", speed=4.0)
    real = float((await redis.time())[0])
    b = await s.push({ORG: Counts(2, 1, 0)})
    t = await s.server_time()
    assert abs(t - 4 * real) < 4 * 5 and b <= t < b + S.bucket_seconds + 1
    snap = await s.read_snapshot()
    assert sum(snap.buckets[ORG].values(), Counts()) == Counts(2, 1, 0)
    assert abs(snap.now - t) < 4 * 5
    gen, token = await s.acquire("w1")
    assert gen
    assert 0 < await redis.pttl("t:circuit:leader") <= S.lease_ttl / 4 * 1000
    assert await s.write(token, gen, [])
    assert abs((await s.read_view()).beat_at - t) < 4 * 5  # type: ignore[operator]
    assert await s.reserve_probe(ORG, "w1")
    assert 0 < await redis.pttl(f"t:circuit:probe:{ORG}") <= S.probe_interval / 4 * 1000
