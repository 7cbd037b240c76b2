"""The chain recorder counts what the chain did, and the collector names it as Prometheus and
Resilience4j users expect; the textfile parses with Prometheus' own parser."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from batch.clock import FakeClock
from batch.dispatch.stats import ProviderStats
from batch.observe.collector import RunCollector
from batch.observe.exposition import write_textfile
from batch.observe.recorder import ChainRecorder
from batch.resilience import BreakerSettings, ChainSettings, LimiterSettings, RetrySettings
from batch.resilience.chain import ProviderChain
from tests.resilience.fakes import (
    CONN,
    DOWN,
    FAULT,
    OK,
    THROTTLED,
    UNKNOWN,
    Provider,
    drive,
)

ORG = "BANK000001"


def make(clock: FakeClock, rec: ChainRecorder, *, max_attempts: int = 3,
         window: int = 4) -> ProviderChain:
    s = ChainSettings(
        breaker=BreakerSettings(window_size=window, minimum_calls=window, open_wait=30.0,
                                half_open_permits=1),
        retry=RetrySettings(max_attempts=max_attempts, budget_floor=100),
        limiter=LimiterSettings(calls_per_second=1e6, burst=1000))
    chain = ProviderChain(ORG, s, clock=clock, random=lambda: 0.0, listeners=[rec])
    rec.track(ORG, max_attempts=max_attempts)
    return chain


@dataclass
class FakeDispatcher:
    """What the collector reads of a dispatcher."""

    org_code: str
    stats: ProviderStats
    remaining: int = 0
    queue_depth: int = 0


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = write_textfile_text(registry)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def write_textfile_text(registry: CollectorRegistry) -> str:
    from prometheus_client.exposition import generate_latest

    return generate_latest(registry).decode()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return samples(registry)[(name, tuple(sorted(labels.items())))]


async def test_calls_are_counted_by_outcome_class_retry_kind_and_breaker_kind() -> None:
    clock = FakeClock()
    rec = ChainRecorder()
    chain = make(clock, rec, window=20)
    # ok at once; ok after one retry; failed after every attempt; unknown; throttled
    await drive(clock, chain.call(Provider(clock, [OK])))
    await drive(clock, chain.call(Provider(clock, [FAULT, OK])))
    await drive(clock, chain.call(Provider(clock, [CONN, DOWN, FAULT])))
    await drive(clock, chain.call(Provider(clock, [UNKNOWN])))
    await drive(clock, chain.call(Provider(clock, [THROTTLED])))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec))

    assert value(reg, "mydata_calls_total", provider=ORG, outcome="success") == 2
    assert value(reg, "mydata_calls_total", provider=ORG, outcome="fault") == 1
    assert value(reg, "mydata_calls_total", provider=ORG, outcome="timeout") == 1
    assert value(reg, "mydata_calls_total", provider=ORG, outcome="throttled") == 1
    assert value(reg, "mydata_retry_calls_total", provider=ORG,
                 kind="successful_without_retry") == 1
    assert value(reg, "mydata_retry_calls_total", provider=ORG,
                 kind="successful_with_retry") == 1
    assert value(reg, "mydata_retry_calls_total", provider=ORG, kind="failed_with_retry") == 1
    assert value(reg, "mydata_retry_calls_total", provider=ORG,
                 kind="failed_without_retry") == 2
    assert value(reg, "mydata_circuitbreaker_calls_total", provider=ORG,
                 kind="successful") == 2
    assert value(reg, "mydata_circuitbreaker_calls_total", provider=ORG, kind="failed") == 2
    assert value(reg, "mydata_circuitbreaker_calls_total", provider=ORG, kind="ignored") == 1
    assert value(reg, "mydata_retries_total", provider=ORG) == 3
    assert value(reg, "mydata_calls_max_attempts_total", provider=ORG) == 1
    assert value(reg, "mydata_calls_max_attempts_ratio", provider=ORG) == 1 / 5
    assert value(reg, "mydata_call_attempts_count", provider=ORG) == 5
    assert value(reg, "mydata_call_attempts_sum", provider=ORG) == 1 + 2 + 3 + 1 + 1
    assert value(reg, "mydata_call_attempts_bucket", provider=ORG, le="1.0") == 3
    # every attempt has its latency (a retry storm's failed ones too), every call its own
    assert value(reg, "mydata_attempt_duration_seconds_count", provider=ORG) == 8
    assert value(reg, "mydata_call_duration_seconds_count", provider=ORG) == 5
    assert value(reg, "mydata_call_unknown_outcomes_total", provider=ORG) == 1
    assert value(reg, "mydata_call_timeouts_total", provider=ORG) == 0  # 50003 is an answer
    assert value(reg, "mydata_throttled_calls_total", provider=ORG, code="42902") == 1
    assert value(reg, "mydata_ratelimiter_adjustments_total", provider=ORG,
                 reason="throttled") == 1
    assert value(reg, "mydata_retry_skipped_total", provider=ORG, reason="attempts") == 1


async def test_breaker_state_is_one_hot_and_transitions_and_refusals_are_counted() -> None:
    clock = FakeClock()
    rec = ChainRecorder()
    chain = make(clock, rec, max_attempts=1)
    for _ in range(4):
        await drive(clock, chain.call(Provider(clock, default=FAULT)))
    for _ in range(3):
        await drive(clock, chain.call(Provider(clock)))  # refused: open
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec))
    got = {s: value(reg, "mydata_circuitbreaker_state", provider=ORG, state=s)
           for s in ("closed", "open", "half_open", "forced_open")}
    assert got == {"closed": 0, "open": 1, "half_open": 0, "forced_open": 0}
    assert value(reg, "mydata_circuitbreaker_transitions_total", provider=ORG,
                 from_state="closed", to_state="open") == 1
    assert value(reg, "mydata_circuitbreaker_calls_total", provider=ORG,
                 kind="not_permitted") == 3
    assert value(reg, "mydata_rejections_total", provider=ORG, layer="breaker") == 3
    assert value(reg, "mydata_calls_total", provider=ORG, outcome="rejected") == 3
    # the open seconds of the minute: from the trip to the cut
    clock.advance(12.5)
    assert rec.cut_minute(ORG, clock.monotonic()).open_seconds == 12.5
    assert rec.cut_minute(ORG, clock.monotonic() + 1.0).worst_state == "open"


async def test_latency_and_failures_carry_the_tran_id_as_an_exemplar_in_openmetrics_only(
        tmp_path: Path) -> None:
    clock = FakeClock()
    rec = ChainRecorder()
    chain = make(clock, rec, max_attempts=1)
    await drive(clock, chain.call(Provider(clock, [FAULT], latency=0.2)))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec))
    om = openmetrics(reg).decode()
    bucket = [ln for ln in om.splitlines()
              if ln.startswith('mydata_call_duration_seconds_bucket{le="0.25"')]
    assert bucket and 'trace_id="OPERATOR01T00000000000000"' in bucket[0], om
    fail = [ln for ln in om.splitlines()
            if ln.startswith("mydata_calls_total") and 'outcome="fault"' in ln]
    assert fail and "# {trace_id=" in fail[0]
    path = write_textfile(reg, tmp_path / "mydata.prom")
    text = path.read_text()
    assert "trace_id" not in text  # the node exporter's format has no exemplars
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"mydata_calls", "mydata_call_duration_seconds", "mydata_circuitbreaker_state"
            } <= names
    assert [p.name for p in path.parent.iterdir()] == ["mydata.prom"]  # no temporary left


def test_labels_are_bounded_to_provider_and_classes() -> None:
    rec = ChainRecorder()
    rec.track(ORG, max_attempts=3)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec))
    allowed = {"provider", "outcome", "kind", "state", "from_state", "to_state", "reason",
               "layer", "code", "le", "action"}
    for (_, labels) in samples(reg):
        assert {k for k, _ in labels} <= allowed


def test_the_started_counter_never_goes_down_when_our_own_refusals_give_starts_back() -> None:
    d = FakeDispatcher(ORG, ProviderStats(ORG, day_quota=5))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(ChainRecorder(), dispatchers=lambda: (d,)))
    d.stats.started = 3
    before = value(reg, "mydata_dispatch_started_total", provider=ORG)
    # one of the three comes back "not attempted": the dispatcher gives its start back
    d.stats.started -= 1
    d.stats.by_action["not_attempted"] += 1
    assert before == 3
    assert value(reg, "mydata_dispatch_started_total", provider=ORG) == 3


async def test_label_values_stay_bounded_after_traffic_of_every_kind() -> None:
    """test_labels_are_bounded_to_provider_and_classes looks at label *names* of a recorder
    that saw no call, so it passes whatever value a label takes. Here every kind of call
    goes through the chain (each attempt with its own x-api-tran-id), a dispatcher reports
    every action, and every label *value* must come from a fixed set: never a tran id,
    consent or user id."""
    from batch.lifecycle import Step
    from batch.observe.recorder import BREAKER_KINDS, BREAKER_STATES, KINDS, RETRY_KINDS
    from batch.resilience.outcomes import Layer
    from tests.resilience.fakes import BAD_REQUEST, DEAD

    clock = FakeClock()
    rec = ChainRecorder()
    chain = make(clock, rec, window=10)
    for answers in ([OK], [FAULT, OK], [CONN, DOWN, FAULT], [UNKNOWN], [THROTTLED],
                    [DEAD], [BAD_REQUEST]):
        await drive(clock, chain.call(Provider(clock, answers, latency=0.01)))
    p = rec.providers[ORG]
    for _ in range(20):  # trip the breaker, then be refused by it
        if p.state == "open":
            break
        await drive(clock, chain.call(Provider(clock, default=FAULT)))
    await drive(clock, chain.call(Provider(clock)))
    stats = ProviderStats(ORG, day_quota=5)
    for step in Step:
        stats.by_action[step.value] += 1
    stats.lateness += [0.001, 0.3]
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(rec, dispatchers=lambda: (
        FakeDispatcher(ORG, stats, remaining=1, queue_depth=2),)))

    values = {"provider": {ORG}, "outcome": set(KINDS),
              "kind": set(BREAKER_KINDS) | set(RETRY_KINDS), "state": set(BREAKER_STATES),
              "from_state": set(BREAKER_STATES), "to_state": set(BREAKER_STATES),
              "reason": {"attempts", "breaker", "deadline", "budget", "other", "throttled",
                         "paused", "retry_after", "recovered"},
              "layer": {str(x) for x in Layer} | {"retry_budget"},
              "action": {s.value for s in Step}}
    seen: dict[str, set[str]] = {}
    for (_, labels) in samples(reg):
        for k, v in labels:
            seen.setdefault(k, set()).add(v)
            assert "OPERATOR01T" not in v, (k, v)  # a tran id is an exemplar, not a label
            if k == "le":
                assert v == "+Inf" or float(v) >= 0, v
            elif k == "code":
                assert v == "none" or (v.isdigit() and len(v) in (3, 5)), v
            else:
                assert v in values[k], (k, v)  # an unknown label name fails here too
    # the traffic really reached the labelled families (not just zero-valued series)
    got = samples(reg)
    for outcome in KINDS:
        assert got[("mydata_calls_total", (("outcome", outcome), ("provider", ORG)))] > 0, \
            outcome
    assert "42902" in seen["code"]
    assert got[("mydata_circuitbreaker_transitions_total", (
        ("from_state", "closed"), ("provider", ORG), ("to_state", "open")))] == 1
    assert seen["action"] == values["action"]
