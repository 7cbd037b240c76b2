"""The cluster circuit's pure decisions: rates over the window, minimum sample, open and
close, the healthy period, forced states, the fallback timing and the probe designation."""

from __future__ import annotations

import pytest

from batch.cluster.circuit import (
    CircuitSettings,
    CircuitState,
    Counts,
    Forced,
    ProbePacer,
    ProviderCircuit,
    ViewMode,
    changed,
    count_of,
    decide,
    probe_workers,
    view_mode,
    window_totals,
)
from batch.errors import ConfigError
from batch.resilience.events import CallFinished
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected

S = CircuitSettings(window_seconds=60, bucket_seconds=5, minimum_calls=20,
                    failure_rate_threshold=0.5, slow_call_rate_threshold=0.6,
                    healthy_period=30, probe_minimum=3, healthy_rate=0.1)
ORG = "BANK000001"


def closed(since: float = 0.0) -> ProviderCircuit:
    return ProviderCircuit(ORG, CircuitState.CLOSED, since, "")


def opened(since: float) -> ProviderCircuit:
    return ProviderCircuit(ORG, CircuitState.OPEN, since, "failure rate")


def test_window_sums_only_the_buckets_that_overlap_the_last_window() -> None:
    b = {0: Counts(10, 0), 40: Counts(1, 2), 95: Counts(3, 4, 1), 100: Counts(0, 1)}
    # now=100, 60 s: [40, 100] overlaps buckets 40 (40-45), 95 and 100; bucket 0 has aged out
    assert window_totals(b, now=100, seconds=60, bucket_seconds=5) == Counts(4, 7, 1)
    # a bucket that ends exactly at the window's start is out
    assert window_totals({35: Counts(9, 9)}, now=100, seconds=60, bucket_seconds=5) == Counts()
    assert window_totals(b, now=100, seconds=60, bucket_seconds=5, since=96) == Counts(3, 5, 1)


def test_no_verdict_below_the_minimum_sample_however_bad() -> None:
    b = {100: Counts(0, 19)}
    assert decide(ORG, closed(), b, now=101, forced=None, settings=S).state \
        is CircuitState.CLOSED
    b = {100: Counts(0, 20)}
    got = decide(ORG, closed(), b, now=101, forced=None, settings=S)
    assert got.state is CircuitState.OPEN
    assert got.since == 101
    assert "failure rate 100% of 20 calls" in got.reason


def test_opens_at_the_failure_threshold_cluster_wide_not_below() -> None:
    # the talk's case: one server's calls all fail, the cluster's 10 %: stays closed
    assert decide(ORG, closed(), {100: Counts(90, 10)}, now=101, forced=None,
                  settings=S).state is CircuitState.CLOSED
    assert decide(ORG, closed(), {100: Counts(51, 49)}, now=101, forced=None,
                  settings=S).state is CircuitState.CLOSED
    assert decide(ORG, closed(), {100: Counts(50, 50)}, now=101, forced=None,
                  settings=S).state is CircuitState.OPEN


def test_opens_on_the_slow_call_rate() -> None:
    got = decide(ORG, closed(), {100: Counts(40, 0, 24)}, now=101, forced=None, settings=S)
    assert got.state is CircuitState.OPEN
    assert got.reason.startswith("slow-call rate 60%")
    assert decide(ORG, closed(), {100: Counts(40, 0, 23)}, now=101, forced=None,
                  settings=S).state is CircuitState.CLOSED


def test_failures_that_aged_out_of_the_window_do_not_open_it() -> None:
    b = {0: Counts(0, 100), 100: Counts(20, 0)}
    assert decide(ORG, closed(), b, now=101, forced=None, settings=S).state \
        is CircuitState.CLOSED


def test_open_stays_open_until_a_whole_healthy_period_of_probes() -> None:
    b = {200: Counts(5, 0)}  # healthy probes, but opened only 20 s ago
    assert decide(ORG, opened(185), b, now=205, forced=None, settings=S).state \
        is CircuitState.OPEN
    got = decide(ORG, opened(170), b, now=205, forced=None, settings=S)
    assert got.state is CircuitState.CLOSED
    assert got.since == 205
    assert got.reason.startswith("healthy for 30 s (5 probes")


def test_open_does_not_close_on_too_few_probes_or_failing_ones() -> None:
    assert decide(ORG, opened(100), {200: Counts(2, 0)}, now=205, forced=None,
                  settings=S).state is CircuitState.OPEN
    # 1 failure in 5 = 20 % > healthy_rate 10 %
    assert decide(ORG, opened(100), {200: Counts(4, 1)}, now=205, forced=None,
                  settings=S).state is CircuitState.OPEN
    # a failure still inside the healthy period keeps it open, one that left it does not
    b = {170: Counts(0, 3), 190: Counts(10, 0)}
    assert decide(ORG, opened(100), b, now=199, forced=None, settings=S).state \
        is CircuitState.OPEN
    assert decide(ORG, opened(100), b, now=205, forced=None, settings=S).state \
        is CircuitState.CLOSED


def test_slow_probes_keep_it_open() -> None:
    assert decide(ORG, opened(100), {200: Counts(10, 0, 2)}, now=205, forced=None,
                  settings=S).state is CircuitState.OPEN


def test_open_keeps_its_since_and_reports_the_rates() -> None:
    got = decide(ORG, opened(100), {200: Counts(1, 3)}, now=205, forced=None, settings=S,
                 generation=7)
    assert (got.state, got.since, got.reason) == (CircuitState.OPEN, 100, "failure rate")
    assert (got.calls, got.failure_rate, got.generation) == (4, 0.75, 7)


def test_forced_states_win_over_the_counts_and_release_starts_closed() -> None:
    f = Forced(CircuitState.FORCED_CLOSED, "provider says it is fine", since=50, actor="kim")
    got = decide(ORG, closed(), {100: Counts(0, 100)}, now=101, forced=f, settings=S)
    assert got.state is CircuitState.FORCED_CLOSED
    assert got.since == 50
    assert got.reason == "forced by kim: provider says it is fine"
    f = Forced(CircuitState.FORCED_OPEN, "maintenance", since=60)
    assert decide(ORG, closed(), {100: Counts(100, 0)}, now=101, forced=f,
                  settings=S).state is CircuitState.FORCED_OPEN
    released = decide(ORG, got, {100: Counts(0, 100)}, now=102, forced=None, settings=S)
    assert (released.state, released.since, released.reason) == (
        CircuitState.CLOSED, 102, "force released")
    # judged afresh on the next decision
    assert decide(ORG, released, {100: Counts(0, 100)}, now=103, forced=None,
                  settings=S).state is CircuitState.OPEN


def test_forced_needs_a_reason_and_a_forced_state() -> None:
    with pytest.raises(ValueError, match="reason"):
        Forced(CircuitState.FORCED_OPEN, " ", since=0)
    with pytest.raises(ValueError, match="forced_open or forced_closed"):
        Forced(CircuitState.OPEN, "x", since=0)


def test_changed_is_a_state_move_not_a_new_rate() -> None:
    a = opened(100)
    assert not changed(a, ProviderCircuit(ORG, CircuitState.OPEN, 100, "x", 0.9, 0, 50))
    assert changed(a, closed(200))
    assert changed(None, a)
    assert not changed(None, closed())


def test_count_of_a_call_follows_the_local_breakers_neutral_kinds() -> None:
    def ev(kind: Kind, slowest: float = 0.1, attempts: int = 1, duration: float = 0.0
           ) -> CallFinished:
        return CallFinished(ORG, None, Outcome(kind), attempts, max(duration, slowest),
                            slowest)

    assert count_of(ev(Kind.SUCCESS), 5.0) == Counts(1, 0, 0)
    assert count_of(ev(Kind.FAULT), 5.0) == Counts(0, 1, 0)
    assert count_of(ev(Kind.TIMEOUT, 6.0), 5.0) == Counts(0, 1, 1)
    assert count_of(ev(Kind.SUCCESS, 4.5, attempts=2, duration=9.0), 5.0) == Counts(1, 0, 0)
    # 8 s spent waiting for our own limiter, 0.2 s at the provider: not a slow provider
    assert count_of(ev(Kind.SUCCESS, 0.2, duration=8.2), 5.0) == Counts(1, 0, 0)
    for kind in (Kind.THROTTLED, Kind.CONSENT, Kind.CLIENT):
        assert count_of(ev(kind), 5.0) is None
    assert count_of(CallFinished(ORG, None, rejected(Layer.BREAKER), 0, 0.0), 5.0) is None


def test_view_keeps_the_last_list_for_a_bounded_time_then_goes_local() -> None:
    assert view_mode(now=0, fresh_at=None, fresh=False, keep_last_for=60) is ViewMode.LOCAL
    assert view_mode(now=100, fresh_at=90, fresh=True, keep_last_for=60) is ViewMode.CLUSTER
    assert view_mode(now=150, fresh_at=90, fresh=False, keep_last_for=60) is ViewMode.STALE
    assert view_mode(now=150.5, fresh_at=90, fresh=False, keep_last_for=60) is ViewMode.LOCAL


def test_probe_workers_are_the_oldest_and_the_newest() -> None:
    assert probe_workers(["w1", "w2", "w3", "w4"]) == {"w1", "w4"}
    assert probe_workers(["w1"]) == {"w1"}
    assert probe_workers([]) == frozenset()


def test_probe_pacer_lets_one_start_per_interval() -> None:
    p = ProbePacer(0.5)
    assert [p.take(t) for t in (0.0, 0.1, 0.49, 0.5, 0.6, 1.0)] == [
        True, False, False, True, False, True]


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ConfigError, match=r"circuit\.probe_rate"):
        CircuitSettings(probe_rate=0)
    with pytest.raises(ConfigError, match=r"circuit\.healthy_rate"):
        CircuitSettings(healthy_rate=0.5, failure_rate_threshold=0.5)
    with pytest.raises(ConfigError, match=r"circuit\.lease_ttl"):
        CircuitSettings(lease_ttl=1, coordinator_interval=1)
    with pytest.raises(ConfigError, match=r"circuit\.bucket_seconds"):
        CircuitSettings(bucket_seconds=0)
    assert CircuitSettings(window_seconds=60, healthy_period=90,
                           bucket_seconds=5).history_buckets == 19


def test_provider_circuit_round_trips_through_json() -> None:
    c = ProviderCircuit(ORG, CircuitState.OPEN, 1.5, "why", 0.25, 0.5, 8, 3)
    assert ProviderCircuit.from_json(c.to_json()) == c


def test_settings_from_a_mydata_circuit_spec_set_only_the_fields_named() -> None:
    s = CircuitSettings.from_spec("healthy_period=10; refresh_interval=2;bucket_seconds=1")
    assert (s.healthy_period, s.refresh_interval, s.bucket_seconds) == (10.0, 2.0, 1)
    assert s.window_seconds == CircuitSettings().window_seconds
    assert CircuitSettings.from_spec(None) == CircuitSettings.from_spec("") == CircuitSettings()


@pytest.mark.parametrize(("spec", "field"), [
    ("nonsense=1", "MYDATA_CIRCUIT"), ("healthy_period", "MYDATA_CIRCUIT"),
    ("probe_rate=fast", "circuit.probe_rate"), ("minimum_calls=2.5", "circuit.minimum_calls"),
    ("healthy_period=-1", "circuit.healthy_period"),
])
def test_a_bad_mydata_circuit_spec_names_its_field(spec: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        CircuitSettings.from_spec(spec)
    assert err.value.field == field


async def test_a_coordinator_without_redis_says_so_once_and_again_when_it_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import logging

    from batch.clock import SystemClock
    from batch.cluster.coordinator import Coordinator

    class Store:  # Redis down for 5 ticks, then another worker holds the lease
        settings = CircuitSettings(coordinator_interval=0.01, lease_ttl=1.0)

        def __init__(self) -> None:
            self.calls = 0

        async def acquire(self, candidate: str) -> tuple[int, str]:
            self.calls += 1
            if self.calls <= 5:
                raise ConnectionError("Error 111 connecting to 127.0.0.1:6390")
            return 0, "7:other"

    store = Store()
    c = Coordinator(store, candidate_id="w1", clock=SystemClock())  # type: ignore[arg-type]
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="mydata.cluster")
    task = asyncio.create_task(c.run(stop))
    while c.ticks < 8:
        c.ticked.clear()
        await c.ticked.wait()
    stop.set()
    await task
    actions = [getattr(r, "action", "") for r in caplog.records]
    assert actions.count("coordinator_tick_failed") == 1
    assert actions.count("coordinator_tick_recovered") == 1
    assert c.failed_ticks == 5
