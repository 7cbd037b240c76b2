"""The chain listener that counts what every provider's chain did.

It is called synchronously for each event on the hot path, so it only bumps plain ints and
appends to lists in slotted objects: no locks, no label lookups, no Prometheus objects. The
collector turns these numbers into metric families at collection time, and the session
swaps each provider's per-minute counts into a ``run_minutes`` row once a minute.

Classes follow Resilience4j: the breaker's calls are ``successful`` / ``failed`` (a fault or
a timeout) / ``ignored`` (neutral: consent, client, throttled, our refusals after admission)
/ ``not_permitted`` (refused by an open breaker); the retry's are split by whether the call
succeeded and whether it was retried.
"""

from __future__ import annotations

from bisect import bisect_left as _bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from batch.observe.hist import ATTEMPT_BUCKETS, LATENCY_BUCKETS, Hist
from batch.resilience.events import (
    CallFinished,
    CallSink,
    Event,
    RateAdjusted,
    Rejected,
    RetryScheduled,
    RetrySkipped,
    StateChanged,
)
from batch.resilience.outcomes import Kind, Layer, Outcome

KINDS = tuple(k.value for k in Kind)
# ProviderCalls.breaker_calls and retry_calls name every kind
assert set(KINDS) == {"success", "fault", "timeout", "throttled", "consent", "client",
                      "rejected"}, KINDS
BREAKER_KINDS = ("successful", "failed", "ignored", "not_permitted")
RETRY_KINDS = ("successful_without_retry", "successful_with_retry", "failed_with_retry",
               "failed_without_retry")
BREAKER_STATES = ("closed", "open", "half_open", "forced_open", "disabled", "metrics_only")
OPEN_STATES = frozenset({"open", "forced_open"})
#: RetrySkipped reasons, mapped to a bounded label
_SUCCESS, _TIMEOUT = Kind.SUCCESS, Kind.TIMEOUT
_THROTTLED, _REJECTED, _BREAKER = Kind.THROTTLED, Kind.REJECTED, Layer.BREAKER
_ATTEMPT_TOP = len(ATTEMPT_BUCKETS)
assert tuple(float(i) for i in range(1, _ATTEMPT_TOP + 1)) == ATTEMPT_BUCKETS
SKIP_REASONS = {"attempts exhausted": "attempts", "breaker not closed": "breaker",
                "deadline": "deadline", "retry budget exhausted": "budget"}


def rate_reason(reason: str) -> str:
    """RateAdjusted's reason as a bounded label: throttled, paused, retry_after, recovered."""
    if reason.startswith("paused"):
        return "paused"
    if reason == "retry-after":
        return "retry_after"
    return reason if reason in ("throttled", "recovered") else "other"


@dataclass(slots=True)
class MinuteCounts:
    """What one provider's chain did since the last minute row was cut."""

    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    calls: int = 0
    attempts: int = 0
    retried: int = 0
    max_attempts: int = 0
    latencies: list[float] = field(default_factory=list)
    open_seconds: float = 0.0
    worst_state: str = "closed"


@dataclass(slots=True)
class ProviderCalls:
    """Running totals for one provider since the run started."""

    org_code: str
    max_attempts: int = 0  # the chain's retry.max_attempts; 0 while unknown
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    #: calls our breaker refused (the REJECTED kind's share that is the breaker's)
    not_permitted: int = 0
    successful_with_retry: int = 0
    failed_with_retry: int = 0
    used_every_attempt: int = 0
    timeouts: int = 0
    unknown: int = 0
    by_throttle_code: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    retries_scheduled: int = 0
    retries_skipped: dict[str, int] = field(default_factory=dict)
    transitions: dict[tuple[str, str], int] = field(default_factory=dict)
    rate_changes: dict[str, int] = field(default_factory=dict)
    state: str = "closed"
    open_since: float | None = None
    rate: float | None = None
    attempts: Hist = field(default_factory=lambda: Hist(ATTEMPT_BUCKETS))
    duration: Hist = field(default_factory=lambda: Hist(LATENCY_BUCKETS))
    attempt_duration: Hist = field(default_factory=lambda: Hist(LATENCY_BUCKETS))
    #: the x-api-tran-id of the last failed call per outcome class (an exemplar)
    last_failure: dict[str, tuple[str, float]] = field(default_factory=dict)
    minute: MinuteCounts = field(default_factory=MinuteCounts)

    # The breaker's and the retry's views of the calls are the kinds counted once more, so
    # they are read from the kinds (and the few counts only they need), not counted on
    # every call: two counts of a dict a call were 1,400 of the recorder's 10,600
    # instructions (cachegrind).
    @property
    def breaker_calls(self) -> dict[str, int]:
        """Calls as the breaker saw them, by BREAKER_KINDS."""
        k = self.by_kind
        return {
            "successful": k["success"],
            "failed": k["fault"] + k["timeout"],
            "ignored": (k["throttled"] + k["consent"] + k["client"] + k["rejected"]
                        - self.not_permitted),
            "not_permitted": self.not_permitted,
        }

    @property
    def retry_calls(self) -> dict[str, int]:
        """Calls that reached the provider by result and whether retried, by RETRY_KINDS."""
        k = self.by_kind
        failed = k["fault"] + k["timeout"] + k["throttled"] + k["consent"] + k["client"]
        return {
            "successful_without_retry": k["success"] - self.successful_with_retry,
            "successful_with_retry": self.successful_with_retry,
            "failed_with_retry": self.failed_with_retry,
            "failed_without_retry": failed - self.failed_with_retry,
        }


def _record_call(p: ProviderCalls, tran: str | None, o: Outcome, n: int,
                 duration: float) -> None:
    """One call's end at ``p``'s provider: ``o`` after ``n`` attempts in ``duration`` s."""
    kind = o.kind
    # a plain str key: an Enum member's __hash__ is a Python-level call (hot path)
    key: str = kind._value_
    m = p.minute
    p.by_kind[key] += 1
    m.by_kind[key] += 1
    if kind is _REJECTED:
        if o.layer is _BREAKER:
            p.not_permitted += 1
        return  # never reached the provider: no attempt, no latency
    retried = n > 1
    if kind is _SUCCESS:
        if retried:
            p.successful_with_retry += 1
    else:
        if retried:
            p.failed_with_retry += 1
        if kind is _TIMEOUT:
            p.unknown += 1
            if o.rsp_code is None:
                p.timeouts += 1
        elif kind is _THROTTLED:
            code = o.rsp_code or str(o.http_status or "none")
            p.by_throttle_code[code] = p.by_throttle_code.get(code, 0) + 1
        if tran is not None:
            p.last_failure[key] = (tran, float(n))
    h = p.attempts  # ATTEMPT_BUCKETS are 1..5: attempt n falls in bucket n - 1
    h.counts[n - 1 if n <= _ATTEMPT_TOP else _ATTEMPT_TOP] += 1
    h.total += n
    # Hist.observe twice, inline (two frames of the chain's 11,400 instructions a call for
    # the recorder, cachegrind): the bucket, its count, the sum, the bucket's exemplar
    h = p.duration
    i = _bisect(h.bounds, duration)
    h.counts[i] += 1
    h.total += duration
    elapsed = o.elapsed
    a = p.attempt_duration
    j = _bisect(a.bounds, elapsed)
    a.counts[j] += 1
    a.total += elapsed
    if tran is not None:
        h.exemplars[i] = (tran, duration)
        a.exemplars[j] = (tran, elapsed)
    m.calls += 1
    m.attempts += n
    m.latencies.append(duration)
    if retried:
        m.retried += 1
        if n >= p.max_attempts > 0:
            p.used_every_attempt += 1
            m.max_attempts += 1
    elif p.max_attempts == 1:
        p.used_every_attempt += 1
        m.max_attempts += 1


class ChainRecorder:
    """A :class:`~batch.resilience.events.Listener` for every provider's chain at once."""

    __slots__ = ("_on", "providers")

    def __init__(self) -> None:
        self.providers: dict[str, ProviderCalls] = {}
        self._on: dict[type, Callable[[ProviderCalls, Event], None]] = {
            CallFinished: self._call, StateChanged: self._state, Rejected: self._rejected,
            RetryScheduled: self._retry, RetrySkipped: self._skipped,
            RateAdjusted: self._rate,
        }

    def track(self, org_code: str, *, max_attempts: int) -> ProviderCalls:
        """Know a provider before its first event (its series exist from the start)."""
        p = self.provider(org_code)
        p.max_attempts = max_attempts
        return p

    def provider(self, org_code: str) -> ProviderCalls:
        p = self.providers.get(org_code)
        if p is None:
            p = self.providers[org_code] = ProviderCalls(org_code)
        return p

    def __call__(self, event: Event, /) -> None:
        p = self.providers.get(event.org_code)
        if p is None:
            p = self.provider(event.org_code)
        # a chain made for its provider hands every call's end to call_sink, not here
        self._on[type(event)](p, event)

    def call_sink(self, org_code: str) -> CallSink:
        """Every call's end at ``org_code``, as its fields, into that provider's counts: a
        provider's chain calls it instead of building a CallFinished for this recorder
        (:class:`~batch.resilience.events.Listener`)."""
        return partial(_record_call, self.provider(org_code))

    # -- one handler per event type ---------------------------------------------------------

    def _call(self, p: ProviderCalls, event: Event) -> None:
        assert type(event) is CallFinished
        _record_call(p, event.tran_id, event.outcome, event.attempts, event.duration)

    def _state(self, p: ProviderCalls, event: Event) -> None:
        assert isinstance(event, StateChanged)
        key = (event.old, event.new)
        p.transitions[key] = p.transitions.get(key, 0) + 1
        if p.open_since is not None:
            p.minute.open_seconds += max(0.0, event.at - p.open_since)
            p.open_since = None
        if event.new in OPEN_STATES:
            p.open_since = event.at
            p.minute.worst_state = event.new
        elif p.minute.worst_state not in OPEN_STATES:
            p.minute.worst_state = event.new
        p.state = event.new

    def _rejected(self, p: ProviderCalls, event: Event) -> None:
        assert isinstance(event, Rejected)
        layer = str(event.layer)
        p.rejections[layer] = p.rejections.get(layer, 0) + 1

    def _retry(self, p: ProviderCalls, event: Event) -> None:
        assert isinstance(event, RetryScheduled)
        p.retries_scheduled += 1
        # every attempt that reached the provider is in the per-attempt histogram: the ones
        # retried here, the last one with the call (CallFinished)
        if event.kind is not _REJECTED:
            p.attempt_duration.observe(event.elapsed, event.tran_id)

    def _skipped(self, p: ProviderCalls, event: Event) -> None:
        assert isinstance(event, RetrySkipped)
        reason = SKIP_REASONS.get(event.reason, "other")
        p.retries_skipped[reason] = p.retries_skipped.get(reason, 0) + 1
        if reason == "budget":
            p.rejections["retry_budget"] = p.rejections.get("retry_budget", 0) + 1

    def _rate(self, p: ProviderCalls, event: Event) -> None:
        assert isinstance(event, RateAdjusted)
        reason = rate_reason(event.reason)
        p.rate_changes[reason] = p.rate_changes.get(reason, 0) + 1
        p.rate = event.rate

    # -- the minute rows ---------------------------------------------------------------------

    def cut_minute(self, org_code: str, now: float) -> MinuteCounts:
        """Hand over the provider's counts since the last cut and start afresh at ``now``."""
        p = self.provider(org_code)
        m = p.minute
        if p.open_since is not None:
            m.open_seconds += max(0.0, now - p.open_since)
            p.open_since = now
        p.minute = MinuteCounts(worst_state=p.state)
        return m
