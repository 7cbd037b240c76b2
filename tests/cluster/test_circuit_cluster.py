"""Three asyncio workers, each with its own chain, Redis connection and coordinator
candidate, calling the simulator over real HTTP through a staged outage (real seconds, kept
short by fast circuit settings; the deadlines asserted are the issue's 20 s, far above what
the settings need, so a loaded machine does not make them flaky).

- the outage opens the circuit on every worker within 20 s of its start; while it is open
  the provider sees at most the probe rate (its own counts), made by the probe workers only;
  every worker calls it again within 20 s of its recovery;
- the coordinator killed mid-outage (its lease not given back): another worker takes over,
  the circuit stays open, and it still closes on every worker after the recovery;
- Redis stopped (a private redis-server): every worker says so and falls back to its local
  breakers, which still stop the calls to a provider that goes down.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

import pytest

from batch.cluster.circuit import ViewMode
from batch.resilience.breaker import State
from batch.simulator import Event, Scenario, Simulator
from tests.cluster.workers import FAST, Worker, open_now
from tests.integration.helpers import free_ports, make_institutions

pytestmark = pytest.mark.integration

IDS = ("w1", "w2", "w3")  # oldest first: w1 and w3 are the probe workers


async def until(cond: Callable[[], bool], *, by: float, step: float = 0.05) -> float:
    """Poll ``cond`` until it holds (returns time.monotonic() then) or fail at ``by``."""
    while True:
        now = time.monotonic()
        if cond():
            return now
        if now > by:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


async def each_until(workers: Sequence[Worker], cond: Callable[[Worker], bool], *,
                     by: float) -> list[float]:
    """When each worker first met ``cond`` (polled together)."""
    seen: dict[str, float] = {}
    while len(seen) < len(workers):
        now = time.monotonic()
        for w in workers:
            if w.worker_id not in seen and cond(w):
                seen[w.worker_id] = now
        if len(seen) < len(workers) and now > by:
            raise AssertionError(f"only {sorted(seen)} in time")
        await asyncio.sleep(0.05)
    return [seen[w.worker_id] for w in workers]


def leaders(workers: Sequence[Worker]) -> list[str]:
    return [w.worker_id for w in workers if w.coordinator.is_leader]


async def _outage_case(redis_url: str, *, kill_leader: bool) -> None:
    A, B = 4.0, 14.0  # the outage, in seconds after the simulator starts
    insts = make_institutions(free_ports(1), cps=1000, industries=("bank",))
    provider = insts.providers[0]
    org = provider.org_code
    scenario = Scenario(timeline=(Event(provider=org, start=A, end=B, kind="down",
                                        mode="503"),))
    workers = [Worker(wid, i + 1, provider, redis_url, live=IDS) for i, wid in enumerate(IDS)]
    t0 = time.monotonic()  # at or before the simulator's time 0: every delay is an upper bound
    async with Simulator(insts, scenario, window_override=open_now()) as sim:
        try:
            for w in workers:
                await w.start()
            await until(lambda: len(leaders(workers)) == 1 and all(
                w.node.view.mode() is ViewMode.CLUSTER for w in workers), by=t0 + A - 0.5)
            assert not any(w.node.view.is_open(org) for w in workers)
            assert sim.stats()["providers"][org]["calls"] > 0

            opened = await each_until(workers, lambda w: w.node.view.is_open(org),
                                      by=t0 + A + 20)
            assert max(opened) - (t0 + A) <= 20

            if kill_leader:
                (old,) = leaders(workers)
                killed = next(w for w in workers if w.worker_id == old)
                killed.kill_coordinator(f"redis://127.0.0.1:{free_ports(1)[0]}/0")
                await until(lambda: bool(leaders(workers)) and leaders(workers) != [old]
                            and not killed.coordinator.is_leader, by=time.monotonic() + 10)
                (new,) = leaders(workers)
                assert new != old

            await asyncio.sleep(1.0)  # calls in flight when it opened have ended
            sim.reset()
            r0 = time.monotonic()
            still_open = True
            while time.monotonic() < t0 + B - 0.3:
                still_open &= all(w.node.view.is_open(org) for w in workers)
                await asyncio.sleep(0.1)
            seen = sim.stats()["providers"][org]
            span = time.monotonic() - r0
            assert still_open  # across the takeover too
            assert 1 <= seen["calls"] <= FAST.probe_rate * span + 2, (seen["calls"], span)
            assert seen["peak_1s"] <= FAST.probe_rate + 1
            assert workers[1].gate.probes_made == 0  # w2 is no probe worker
            assert workers[0].gate.probes_made + workers[2].gate.probes_made >= 1

            resumed = await each_until(
                workers, lambda w: any(t > t0 + B for t in w.successes.at), by=t0 + B + 20)
            assert max(resumed) - (t0 + B) <= 20
            assert not any(w.node.view.is_open(org) for w in workers)
        finally:
            for w in workers:
                await w.stop()


async def test_outage_opens_everywhere_probes_at_the_rate_and_all_resume(
        redis_url: str) -> None:
    await _outage_case(redis_url, kill_leader=False)


async def test_coordinator_killed_another_takes_over_and_the_outage_case_holds(
        redis_url: str) -> None:
    await _outage_case(redis_url, kill_leader=True)


def _private_redis(port: int) -> subprocess.Popen[bytes]:
    """A redis-server of this test's own (the machine's shared one is never stopped)."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (the Redis-stopped test needs its own)")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, socket_connect_timeout=0.5)
    try:
        for _ in range(100):
            try:
                if r.ping():
                    return proc
            except redis.RedisError:
                time.sleep(0.05)
        proc.kill()
        pytest.fail("the private redis-server did not start")
    finally:
        r.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=5)


async def test_redis_stopped_workers_say_so_and_their_local_breakers_still_protect(
        caplog: pytest.LogCaptureFixture) -> None:
    A, B = 12.0, 40.0  # the provider goes down after the workers have gone local
    port = free_ports(1)[0]
    proc = _private_redis(port)
    insts = make_institutions(free_ports(1), cps=1000, industries=("bank",))
    provider = insts.providers[0]
    org = provider.org_code
    scenario = Scenario(timeline=(Event(provider=org, start=A, end=B, kind="down",
                                        mode="503"),))
    workers = [Worker(wid, i + 1, provider, f"redis://127.0.0.1:{port}/0", live=IDS)
               for i, wid in enumerate(IDS)]
    caplog.set_level(logging.INFO, logger="mydata.cluster")
    t0 = time.monotonic()
    try:
        async with Simulator(insts, scenario, window_override=open_now()) as sim:
            try:
                for w in workers:
                    await w.start()
                await until(lambda: all(w.node.view.mode() is ViewMode.CLUSTER
                                        for w in workers), by=t0 + 3)
                _stop(proc)
                stopped = time.monotonic()
                await each_until(workers, lambda w: w.node.view.mode() is ViewMode.STALE,
                                 by=stopped + FAST.refresh_interval + 3)
                went_local = await each_until(
                    workers, lambda w: w.node.view.mode() is ViewMode.LOCAL,
                    by=stopped + FAST.keep_last_for + FAST.refresh_interval + 3)
                assert min(went_local) - stopped >= FAST.keep_last_for - 0.5
                for w in workers:
                    st = w.node.status()
                    assert st["mode"] == "local"
                    assert st["last_error"]
                # Each says so at its next read of the list (the kept list expires between
                # reads, so the line may follow the switch by a read's interval and time-out)
                def said() -> set[str | None]:
                    return {getattr(r, "worker_id", None) for r in caplog.records
                            if getattr(r, "action", None) == "circuit_mode"
                            and getattr(r, "mode", None) == "local"}

                await until(lambda: said() == set(IDS),
                            by=max(went_local) + FAST.refresh_interval + 5)
                # Still calling the healthy provider, on local protection.
                before = sim.stats()["providers"][org]["calls"]
                await asyncio.sleep(1.0)
                assert sim.stats()["providers"][org]["calls"] > before
                # The provider goes down: every local breaker opens, the calls stop.
                await each_until(workers, lambda w: w.chain.breaker.state is State.OPEN,
                                 by=t0 + A + 20)
                await asyncio.sleep(0.5)
                before = sim.stats()["providers"][org]["calls"]
                await asyncio.sleep(2.0)
                assert sim.stats()["providers"][org]["calls"] == before
            finally:
                for w in workers:
                    await w.stop()
    finally:
        _stop(proc)
