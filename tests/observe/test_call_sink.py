"""The recorder's call sink (a provider's chain hands it each call's fields instead of a
CallFinished) counts exactly what the events counted; a sink that raises breaks no call."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from prometheus_client.registry import CollectorRegistry

from batch.clock import FakeClock
from batch.observe.collector import RunCollector
from batch.observe.recorder import ChainRecorder
from batch.resilience.chain import ProviderChain
from batch.resilience.events import CallFinished, Emitter, Event
from batch.resilience.outcomes import Kind, Outcome
from tests.observe.test_recorder import ORG, make, samples
from tests.resilience.fakes import CONN, DOWN, FAULT, OK, THROTTLED, UNKNOWN, Provider, drive

#: a call each: at once, after a retry, failed after every attempt, unknown, throttled,
#: then enough faults to open the breaker (window 4) and calls it refuses
SCRIPT = [[OK], [FAULT, OK], [CONN, DOWN, FAULT], [UNKNOWN], [THROTTLED],
          [DOWN, DOWN, DOWN], [FAULT, FAULT, FAULT], [OK], [OK]]


class Events:
    """A listener with no call sink: it is called with every event, CallFinished too."""

    def __init__(self, into: ChainRecorder) -> None:
        self.into = into
        self.seen: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.seen.append(event)
        self.into(event)


async def _run(chain: ProviderChain, clock: FakeClock) -> list[Outcome]:
    # each attempt takes time: a retried call's duration is more than its slowest attempt
    return [await drive(clock, chain.call(Provider(clock, list(script), latency=0.02)))
            for script in SCRIPT]


def _figures(rec: ChainRecorder) -> tuple[object, ...]:
    """Everything the recorder exposes of the provider: its metrics and its minute."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec))
    minute = rec.cut_minute(ORG, 0.0)
    return samples(reg), dataclasses.asdict(minute)


async def test_the_sink_counts_what_the_events_counted() -> None:
    # the recorder alone: its sink called by the chain itself (Emitter.sink)
    clock = FakeClock()
    alone = ChainRecorder()
    chain = make(clock, alone)
    assert chain._emit.sink is not None and not chain._emit.calls
    out_alone = await _run(chain, clock)

    # beside a listener called with events (Emitter.ended): a recorder fed those events
    # counts the old way, through __call__
    clock = FakeClock()
    beside, fed = ChainRecorder(), ChainRecorder()
    events = Events(fed)
    chain = make(clock, beside)
    chain = ProviderChain(ORG, chain.settings, clock=clock, random=lambda: 0.0,
                          listeners=[beside, events])
    fed.track(ORG, max_attempts=3)
    assert chain._emit.sink is None and len(chain._emit.sinks) == 1
    out_beside = await _run(chain, clock)

    assert [o.kind for o in out_alone] == [o.kind for o in out_beside]
    assert Kind.REJECTED in [o.kind for o in out_alone]  # the breaker opened and refused
    finished = [e for e in events.seen if type(e) is CallFinished]
    assert len(finished) == len(SCRIPT)  # one a call, refused ones too
    assert _figures(alone) == _figures(beside) == _figures(fed)


async def test_an_emitter_without_the_provider_calls_the_recorder_with_events() -> None:
    rec = ChainRecorder()
    emit = Emitter([rec])  # made without the provider
    assert emit.sinks == () and emit.sink is None and emit.calls and emit.ends
    emit.ended(ORG, "T1", Outcome(Kind.SUCCESS, "00000", 200, elapsed=0.01), 1, 0.02)
    assert rec.providers[ORG].by_kind["success"] == 1
    assert rec.providers[ORG].duration.count == 1


@pytest.mark.parametrize("with_events", [False, True])
async def test_a_sink_that_raises_is_logged_and_breaks_no_call(
        with_events: bool, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(ChainRecorder):
        def call_sink(self, org_code: str):  # type: ignore[no-untyped-def]
            def sink(*_: object) -> None:
                raise RuntimeError("boom")
            return sink

    clock = FakeClock()
    seen: list[Event] = []
    chain = make(clock, ChainRecorder())
    chain = ProviderChain(ORG, chain.settings, clock=clock, random=lambda: 0.0,
                          listeners=[Broken(), *([seen.append] if with_events else [])])
    with caplog.at_level(logging.ERROR, logger="batch.resilience"):
        out = await drive(clock, chain.call(Provider(clock, [OK])))
    assert out.ok
    assert "call sink" in caplog.text and "boom" in caplog.text
    assert len([e for e in seen if type(e) is CallFinished]) == (1 if with_events else 0)
