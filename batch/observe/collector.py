"""The Prometheus collector of a run: builds every metric family at collection time.

Reads the chain recorder's totals, each dispatcher's ``ProviderStats`` (queue depth, slice
lateness, planned vs started) and the last database state; nothing here runs per call.
Labels are bounded: ``provider`` (an org_code), an outcome class, a breaker state, a layer
or reason from a fixed list, and under ``run --processes N`` the worker's ``process`` index
(0 to N-1, the same every night: its textfile beside its siblings' must not repeat theirs).
Exemplars carry the ``x-api-tran-id`` (OpenMetrics only).

    chain       mydata_calls_total{outcome}, mydata_circuitbreaker_calls_total{kind},
                mydata_circuitbreaker_state{state}, mydata_circuitbreaker_transitions_total,
                mydata_retry_calls_total{kind}, mydata_retries_total,
                mydata_retry_skipped_total{reason}, mydata_calls_max_attempts_total,
                mydata_calls_max_attempts_ratio, mydata_call_attempts (histogram),
                mydata_call_duration_seconds, mydata_attempt_duration_seconds,
                mydata_call_timeouts_total, mydata_call_unknown_outcomes_total,
                mydata_throttled_calls_total{code}, mydata_rejections_total{layer},
                mydata_ratelimiter_adjustments_total{reason}, mydata_ratelimiter_rate
    dispatcher  mydata_dispatch_queue_depth, _in_flight, _remaining, _day_quota,
                _minute_planned, _minute_started, _started_total, _provider_calls_total,
                _missed_slices_total, _skipped_breaker_open_total, _dead_lettered_total,
                _refreshes_total{action}, mydata_dispatch_slice_lateness_seconds
    database    mydata_dead_letters, mydata_dead_letter_oldest_age_seconds,
                mydata_consents_overdue, mydata_last_successful_run_timestamp_seconds,
                mydata_state_read_timestamp_seconds; mydata_run_start_timestamp_seconds
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from batch.dispatch.stats import ProviderStats
from batch.observe.hist import LATENESS_BUCKETS, Hist
from batch.observe.recorder import (
    BREAKER_KINDS,
    BREAKER_STATES,
    KINDS,
    RETRY_KINDS,
    ChainRecorder,
    ProviderCalls,
)
from batch.observe.state import StoreState

P = "mydata_"


class Dispatcher(Protocol):
    """What the collector reads of a dispatcher (batch.dispatch.provider.ProviderDispatcher)."""

    org_code: str
    stats: ProviderStats

    @property
    def remaining(self) -> int: ...

    @property
    def queue_depth(self) -> int: ...


class _Lateness:
    """Slice lateness as a histogram, fed incrementally from ``ProviderStats.lateness``."""

    __slots__ = ("hist", "seen")

    def __init__(self) -> None:
        self.hist = Hist(LATENESS_BUCKETS)
        self.seen = 0

    def update(self, samples: list[float]) -> Hist:
        for v in samples[self.seen:]:
            self.hist.observe(v)
        self.seen = len(samples)
        return self.hist


class RunCollector(Collector):
    """Every metric of one run, in one registry."""

    def __init__(self, recorder: ChainRecorder, *,
                 dispatchers: Callable[[], Sequence[Dispatcher]] = tuple,
                 state: Callable[[], StoreState | None] = lambda: None,
                 started_at: float | None = None,
                 labels: Sequence[tuple[str, str]] = ()) -> None:
        self._recorder = recorder
        self._dispatchers = dispatchers
        self._state = state
        self._started_at = started_at
        self._lateness: dict[str, _Lateness] = {}
        #: added to every sample (``process``), after the family's own labels
        self._labels = dict(labels)

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked registration: families are built at collect time

    def collect(self) -> Iterator[Metric]:
        if not self._labels:
            return self._families()
        return self._labelled(self._labels)

    def _labelled(self, extra: dict[str, str]) -> Iterator[Metric]:
        for family in self._families():
            family.samples = [Sample(s.name, {**s.labels, **extra}, s.value, s.timestamp,
                                     s.exemplar) for s in family.samples]
            yield family

    def _families(self) -> Iterator[Metric]:
        provs = sorted(self._recorder.providers.values(), key=lambda p: p.org_code)
        yield from _chain(provs)
        yield from self._dispatch(sorted(self._dispatchers(), key=lambda d: d.org_code))
        state = self._state()
        if state is not None:
            yield from _store(state)
        if self._started_at is not None:
            g = GaugeMetricFamily(P + "run_start_timestamp_seconds",
                                  "When this run started (Unix time).")
            g.add_metric([], self._started_at)
            yield g

    def _dispatch(self, ds: Sequence[Dispatcher]) -> Iterator[Metric]:
        def gauge(name: str, doc: str, get: Callable[[Dispatcher], float]) -> Metric:
            g = GaugeMetricFamily(P + name, doc, labels=["provider"])
            for d in ds:
                g.add_metric([d.org_code], get(d))
            return g

        def counter(name: str, doc: str, get: Callable[[Dispatcher], float]) -> Metric:
            c = CounterMetricFamily(P + name, doc, labels=["provider"])
            for d in ds:
                c.add_metric([d.org_code], get(d))
            return c

        yield gauge("dispatch_queue_depth", "Claimed consents waiting to be started.",
                    lambda d: d.queue_depth)
        yield gauge("dispatch_in_flight", "Refreshes running now.", lambda d: d.stats.in_flight)
        yield gauge("dispatch_remaining", "Refreshes still to start today.",
                    lambda d: d.remaining)
        yield gauge("dispatch_day_quota", "Refreshes planned today.",
                    lambda d: d.stats.day_quota)
        yield gauge("dispatch_minute_planned", "Refreshes planned in the current minute.",
                    lambda d: d.stats.minute_planned)
        yield gauge("dispatch_minute_started", "Refreshes started in the current minute.",
                    lambda d: d.stats.minute_started)
        # ProviderStats.started gives back the refreshes our own layers refused (they are
        # still to do); a counter never goes down, so those are added back.
        yield counter("dispatch_started", "Refreshes started (reaching the chain).",
                      lambda d: d.stats.started + d.stats.by_action.get("not_attempted", 0))
        yield counter("dispatch_provider_calls", "HTTP calls made by finished refreshes.",
                      lambda d: d.stats.calls)
        yield counter("dispatch_missed_slices", "100 ms slices started a whole slice late.",
                      lambda d: d.stats.missed_slices)
        yield counter("dispatch_skipped_breaker_open",
                      "Refreshes left due because the breaker was open.",
                      lambda d: d.stats.skipped_breaker_open)
        yield counter("dispatch_busy_slices",
                      "Slices whose starts waited: as many refreshes under way as the "
                      "provider's concurrency allows.",
                      lambda d: d.stats.busy_slices)
        yield counter("dispatch_dead_lettered", "Consents sent to the dead-letter queue.",
                      lambda d: d.stats.dead_lettered)
        actions = CounterMetricFamily(P + "dispatch_refreshes",
                                      "Finished refreshes by what happens to the consent.",
                                      labels=["provider", "action"])
        for d in ds:
            for action, n in sorted(d.stats.by_action.items()):
                actions.add_metric([d.org_code, action], n)
        yield actions
        late = HistogramMetricFamily(P + "dispatch_slice_lateness_seconds",
                                     "How late each 100 ms slice started.",
                                     labels=["provider"])
        for d in ds:
            h = self._lateness.setdefault(d.org_code, _Lateness()).update(d.stats.lateness)
            _add_hist(late, [d.org_code], h)
        yield late


def _add_hist(family: HistogramMetricFamily, labels: list[str], h: Hist) -> None:
    buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
    for le, n, ex in h.cumulative():
        if ex is None:
            buckets.append((le, float(n)))
        else:
            buckets.append((le, float(n), Exemplar({"trace_id": ex[0]}, ex[1])))
    family.add_metric(labels, buckets, h.total)


def _chain(provs: Sequence[ProviderCalls]) -> Iterator[Metric]:
    def per(name: str, doc: str, get: Callable[[ProviderCalls], float],
            kind: type[CounterMetricFamily] | type[GaugeMetricFamily] = CounterMetricFamily,
            ) -> Metric:
        f: CounterMetricFamily | GaugeMetricFamily = kind(P + name, doc, labels=["provider"])
        for p in provs:
            f.add_metric([p.org_code], get(p))
        return f

    def split(name: str, doc: str, label: str, keys: Sequence[str] | None,
              get: Callable[[ProviderCalls], dict[str, int]]) -> Metric:
        f = CounterMetricFamily(P + name, doc, labels=["provider", label])
        for p in provs:
            values = get(p)
            for k in (keys if keys is not None else sorted(values)):
                f.add_metric([p.org_code, k], values.get(k, 0))
        return f

    calls = CounterMetricFamily(P + "calls", "Logical calls by outcome class.",
                                labels=["provider", "outcome"])
    for p in provs:
        for k in KINDS:
            last = p.last_failure.get(k)
            calls.add_metric([p.org_code, k], p.by_kind[k],
                             exemplar=Exemplar({"trace_id": last[0]}, 1.0)
                             if last is not None else None)
    yield calls
    yield split("circuitbreaker_calls", "Calls as the breaker saw them.", "kind",
                BREAKER_KINDS, lambda p: p.breaker_calls)
    state = GaugeMetricFamily(P + "circuitbreaker_state",
                              "1 for the breaker's current state, 0 for the others.",
                              labels=["provider", "state"])
    for p in provs:
        for s in BREAKER_STATES:
            state.add_metric([p.org_code, s], 1.0 if p.state == s else 0.0)
    yield state
    tr = CounterMetricFamily(P + "circuitbreaker_transitions", "Breaker state changes.",
                             labels=["provider", "from_state", "to_state"])
    for p in provs:
        for (old, new), n in sorted(p.transitions.items()):
            tr.add_metric([p.org_code, old, new], n)
    yield tr
    yield split("retry_calls", "Calls by result and whether they were retried.", "kind",
                RETRY_KINDS, lambda p: p.retry_calls)
    yield per("retries", "Retries scheduled (attempts after the first).",
              lambda p: p.retries_scheduled)
    yield split("retry_skipped", "Retryable faults not retried, by reason.", "reason",
                ("attempts", "breaker", "deadline", "budget", "other"),
                lambda p: p.retries_skipped)
    yield per("calls_max_attempts", "Calls that used every attempt allowed.",
              lambda p: p.used_every_attempt)
    yield per("calls_max_attempts_ratio", "Share of attempted calls that used every attempt.",
              lambda p: p.used_every_attempt / p.attempts.count if p.attempts.count else 0.0,
              GaugeMetricFamily)
    # one family built per step of the caller's (render's) loop: the three built together
    # were one 15-45 ms step at 300 providers
    for name, doc, attr in (
            ("call_attempts", "Attempts per logical call.", "attempts"),
            ("call_duration_seconds", "End-to-end latency of a logical call (all attempts).",
             "duration"),
            ("attempt_duration_seconds", "Latency of each attempt that reached the provider "
             "(the retried ones too).", "attempt_duration")):
        hist = HistogramMetricFamily(P + name, doc, labels=["provider"])
        for p in provs:
            _add_hist(hist, [p.org_code], getattr(p, attr))
        yield hist
    yield per("call_timeouts", "Calls that got no answer in time.", lambda p: p.timeouts)
    yield per("call_unknown_outcomes", "Calls whose outcome is unknown (timeouts, 50003).",
              lambda p: p.unknown)
    yield split("throttled_calls", "Calls the provider throttled, by code (42902: back off).",
                "code", None, lambda p: p.by_throttle_code)
    yield split("rejections", "Calls or retries refused by our own layers.", "layer",
                ("breaker", "limiter", "bulkhead", "retry_budget", "deadline", "shutdown",
                 "window"), lambda p: p.rejections)
    yield split("ratelimiter_adjustments", "Rate limiter changes (throttled: a 42902 "
                "back-off).", "reason", ("throttled", "paused", "retry_after", "recovered"),
                lambda p: p.rate_changes)
    rate = GaugeMetricFamily(P + "ratelimiter_rate", "The limiter's rate after its last "
                             "change, in calls per second (absent: never changed).",
                             labels=["provider"])
    for p in provs:
        if p.rate is not None:
            rate.add_metric([p.org_code], p.rate)
    yield rate


def _store(s: StoreState) -> Iterator[Metric]:
    def per(name: str, doc: str, values: dict[str, int] | dict[str, float]) -> Metric:
        g = GaugeMetricFamily(P + name, doc, labels=["provider"])
        for org, v in sorted(values.items()):
            g.add_metric([org], v)
        return g

    yield per("dead_letters", "Open dead letters.", s.dead_letters)
    yield per("dead_letter_oldest_age_seconds", "Age of the oldest open dead letter.",
              s.dead_letter_oldest_age)
    yield per("consents_overdue", "Active consents past their week (owed since a past "
              "week).", s.overdue)
    last = GaugeMetricFamily(P + "last_successful_run_timestamp_seconds",
                             "When a run last finished with status done (Unix time; 0 "
                             "never).")
    last.add_metric([], s.last_success.timestamp() if s.last_success else 0.0)
    yield last
    read = GaugeMetricFamily(P + "state_read_timestamp_seconds",
                             "When the database gauges were last read (Unix time).")
    read.add_metric([], s.read_at.timestamp())
    yield read
