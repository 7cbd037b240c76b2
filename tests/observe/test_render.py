"""The registry is encoded a few hundred samples per turn of the event loop, and what comes
out is byte for byte what prometheus_client's encoders give for the whole registry at once:
the text format of the textfile and the port, and OpenMetrics with its exemplars."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

import pytest
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import CollectorRegistry

from batch.clock import FakeClock
from batch.dispatch.stats import MinuteRecord, ProviderStats
from batch.observe.collector import RunCollector
from batch.observe.exposition import Encoder, render
from batch.observe.recorder import ChainRecorder
from batch.resilience import BreakerSettings, ChainSettings, LimiterSettings, RetrySettings
from batch.resilience.chain import ProviderChain
from tests.resilience.fakes import CONN, DOWN, FAULT, OK, THROTTLED, UNKNOWN, Provider, drive


@dataclass
class FakeDispatcher:
    org_code: str
    stats: ProviderStats
    remaining: int = 3
    queue_depth: int = 2


async def _registry(providers: int) -> CollectorRegistry:
    """A run's registry after traffic of every kind on each of ``providers`` providers."""
    clock = FakeClock()
    rec = ChainRecorder()
    dispatchers = []
    for i in range(providers):
        org = f"BANK{i:06d}"
        chain = ProviderChain(org, ChainSettings(
            breaker=BreakerSettings(window_size=20, minimum_calls=20),
            retry=RetrySettings(max_attempts=3, budget_floor=100),
            limiter=LimiterSettings(calls_per_second=1e6, burst=1000)),
            clock=clock, random=lambda: 0.0, listeners=[rec])
        rec.track(org, max_attempts=3)
        for answers in ([OK], [FAULT, OK], [CONN, DOWN, FAULT], [UNKNOWN], [THROTTLED]):
            await drive(clock, chain.call(Provider(clock, answers, latency=0.01 * (i % 7))))
        stats = ProviderStats(org, day_quota=50)
        stats.lateness += [0.001 * i, 0.2]
        stats.minutes.append(MinuteRecord(60, 40, 3))
        dispatchers.append(FakeDispatcher(org, stats))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec, dispatchers=lambda: dispatchers, started_at=1.5e9))
    return reg


ENCODERS: dict[str, Encoder] = {
    "text": generate_latest,
    "openmetrics": partial(om.generate_latest, escaping=om.UNDERSCORES, version="1.0.0"),
    "negotiated": choose_encoder("application/openmetrics-text; version=1.0.0")[0],
}


@pytest.mark.parametrize("chunk", [1, 7, 500])
@pytest.mark.parametrize("name", sorted(ENCODERS))
async def test_the_rendered_bytes_are_the_encoders_own(name: str, chunk: int) -> None:
    reg = await _registry(12)
    encoder = ENCODERS[name]
    whole = encoder(reg)
    assert b"mydata_call_duration_seconds_bucket" in whole
    assert await render(reg, encoder, chunk=chunk) == whole
    if name != "text":
        assert b'# {trace_id="OPERATOR01T' in whole and whole.endswith(b"# EOF\n")


async def test_the_loop_gets_a_turn_every_chunk_of_samples() -> None:
    reg = await _registry(30)
    samples = sum(len(f.samples) for f in reg.collect())
    turns = 0
    done = False
    per_turn: dict[int, int] = {}  # samples encoded between two turns of the loop

    def encoder(families: CollectorRegistry) -> bytes:
        fams = list(families.collect())
        per_turn[turns] = per_turn.get(turns, 0) + sum(len(f.samples) for f in fams)
        return generate_latest(families)

    async def count() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    body = await render(reg, encoder, chunk=100)
    done = True
    await counter
    assert body == generate_latest(reg)
    assert sum(per_turn.values()) == samples > 3000
    assert max(per_turn.values()) < 200, per_turn  # a part may end past the chunk: < 2x
    assert len(per_turn) > samples // 200
