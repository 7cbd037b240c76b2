"""Worker-like pieces for the cluster-circuit tests: each has its own Redis connection,
chain, gate, client and coordinator candidate, and calls the simulator over HTTP at a steady
rate the way the dispatcher does (no refresh starts while ``gate.breaker_open()``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import httpx
from redis.asyncio import Redis

from batch.client import MydataClient, make_http_client
from batch.clock import KST, SystemClock
from batch.cluster.circuit import CircuitSettings
from batch.cluster.circuit_node import CircuitNode
from batch.cluster.circuit_redis import CircuitStore
from batch.cluster.coordinator import Coordinator
from batch.config import Provider
from batch.resilience.chain import ProviderChain
from batch.resilience.events import CallFinished, Event
from batch.resilience.outcomes import Kind
from batch.resilience.settings import ChainSettings, LimiterSettings, RetrySettings
from batch.tranid import TranIdGenerator
from planning.windows import Window, parse_window


def open_now() -> list[Window]:
    """A simulator window around the real time now (the tests run on the real clock)."""
    h = datetime.now(KST).hour
    return [parse_window(f"{(h - 1) % 24:02d}00:{(h + 2) % 24:02d}00", step=1)]


FAST = CircuitSettings(window_seconds=3, bucket_seconds=1, minimum_calls=10,
                       healthy_period=3, probe_minimum=2, healthy_rate=0.1, probe_rate=2.0,
                       push_interval=0.5, refresh_interval=1.0, coordinator_interval=0.5,
                       lease_ttl=2.0, coordinator_stale_after=3.0, keep_last_for=5.0)


@dataclass
class Successes:
    """A listener: when each main-chain call succeeded (time.monotonic())."""

    at: list[float] = field(default_factory=list)

    def __call__(self, event: Event, /) -> None:
        if type(event) is CallFinished and event.outcome.kind is Kind.SUCCESS:
            self.at.append(time.monotonic())


class Worker:
    """One asyncio 'worker' of the cluster."""

    def __init__(self, worker_id: str, number: int, provider: Provider, redis_url: str, *,
                 live: Sequence[str], settings: CircuitSettings = FAST,
                 prefix: str = "t:circuit:") -> None:
        clock = SystemClock()
        self.worker_id = worker_id
        self.redis = Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)
        self.coord_redis = Redis.from_url(redis_url, socket_timeout=1,
                                          socket_connect_timeout=1)

        async def live_workers() -> Sequence[str]:
            return live

        self.node = CircuitNode(self.redis, worker_id=worker_id, clock=clock,
                                settings=settings, live_workers=live_workers, candidate=False,
                                prefix=prefix)
        # The candidate has its own connection, so a test can kill it alone.
        self.coordinator = Coordinator(CircuitStore(self.coord_redis, settings=settings,
                                                    prefix=prefix),
                                       candidate_id=worker_id, clock=clock)
        self.successes = Successes()
        chain_settings = ChainSettings(retry=RetrySettings(max_attempts=1),
                                       limiter=LimiterSettings(calls_per_second=1000,
                                                               burst=50))
        self.chain = ProviderChain(provider.org_code, chain_settings, clock=clock,
                                   listeners=(self.node.feed, self.successes))
        self.gate = self.node.gate(self.chain)
        self.http: httpx.AsyncClient = make_http_client()
        self.client = MydataClient(provider, http=self.http, chain=self.gate,
                                   tran_ids=TranIdGenerator("OPERATOR01", node_id=number),
                                   clock=clock)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[object]] = set()
        self.started = 0

    async def start(self) -> None:
        await self.node.start()
        self._tasks = [asyncio.create_task(self._load()),
                       asyncio.create_task(self.coordinator.run(self._stop))]

    async def _load(self) -> None:
        """Start one refresh every 100 ms unless the gate says the provider is open."""
        while not self._stop.is_set():
            if not self.gate.breaker_open():
                self.started += 1
                t = asyncio.create_task(self.client.refresh(
                    access_token=f"{self.worker_id}-{self.started:06d}", refresh_token=None))
                self._calls.add(t)
                t.add_done_callback(self._calls.discard)
            await asyncio.sleep(0.1)

    def kill_coordinator(self, dead_url: str) -> None:
        """As if the candidate's process died: its task stops and its lease is not given
        back (its connection now leads nowhere), so it must expire."""
        self.coordinator.store = CircuitStore(
            Redis.from_url(dead_url, socket_timeout=0.5, socket_connect_timeout=0.5),
            settings=self.coordinator.settings, prefix=self.coordinator.store.prefix)
        self._tasks[1].cancel()

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await asyncio.gather(*self._calls, return_exceptions=True)
        await self.node.stop()
        await self.http.aclose()
        for r in (self.redis, self.coord_redis, self.coordinator.store.redis):
            with contextlib.suppress(Exception):
                await r.aclose()
