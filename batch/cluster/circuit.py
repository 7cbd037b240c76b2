"""The cluster circuit's decisions, pure: rates over a sliding window, open, close, fallback.

Workers count their calls per provider (successes, failures, slow calls) and push the counts
into buckets of ``bucket_seconds`` stamped with the Redis server's clock; the coordinator
(batch/cluster/coordinator.py) sums the buckets of the last ``window_seconds`` and decides
each provider's cluster state with :func:`decide`:

    CLOSED ──(>= minimum_calls in the window, failure or slow-call rate >= threshold)──> OPEN
    OPEN ──(open >= healthy_period, and the last healthy_period holds >= probe_minimum
            calls with failure and slow-call rates <= healthy_rate)──> CLOSED
    forced (operator, `mydata-batch circuit open|close`): FORCED_OPEN / FORCED_CLOSED win
            over the counts until released; released, the provider starts CLOSED afresh.

While a provider is OPEN only probe calls reach it (batch/cluster/probes.py), so the last
``healthy_period`` of an open provider holds probe outcomes only: it closes one healthy
period after it recovered, not after the failures that opened it are diluted.

A worker keeps the last list it read while the list is fresh (Redis answered and the
coordinator's beat is recent, by the server's clock); when it is not, the worker keeps that
last list for ``keep_last_for`` seconds, then falls back to its local breakers only
(:func:`view_mode`): fail-open to local protection, never to no protection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum

from batch.errors import ConfigError
from batch.resilience.events import CallFinished
from batch.resilience.outcomes import Kind
from batch.resilience.settings import SLOW_CALL_SECONDS


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    FORCED_OPEN = "forced_open"
    FORCED_CLOSED = "forced_closed"

    @property
    def is_open(self) -> bool:
        return self is CircuitState.OPEN or self is CircuitState.FORCED_OPEN


class ViewMode(StrEnum):
    """Where a worker's circuit verdicts come from."""

    CLUSTER = "cluster"  # a fresh list from Redis, written by a live coordinator
    STALE = "stale"      # Redis or the coordinator lost: the last list, for a bounded time
    LOCAL = "local"      # no usable list: the local breakers only


def _check(cond: bool, name: str, why: str) -> None:
    if not cond:
        raise ConfigError(why, field=f"circuit.{name}")


@dataclass(frozen=True, slots=True)
class CircuitSettings:
    """How the cluster circuit counts, decides, probes and falls back (seconds, rates)."""

    #: the cluster-wide rates are over this sliding window, in buckets of bucket_seconds
    window_seconds: float = 10.0
    bucket_seconds: int = 2
    #: no verdict before this many calls (cluster-wide) in the window
    minimum_calls: int = 20
    failure_rate_threshold: float = 0.5
    slow_call_rate_threshold: float = 0.6
    slow_call_duration: float = SLOW_CALL_SECONDS
    #: an open provider closes once it has been healthy this long ...
    healthy_period: float = 30.0
    #: ... with at least this many probe calls in that period, failure and slow-call rates
    #: both at most healthy_rate
    probe_minimum: int = 3
    healthy_rate: float = 0.1
    #: probe calls per second to an open provider, the whole cluster together
    probe_rate: float = 1.0
    #: a worker pushes its counts this often, and reads the open list this often
    push_interval: float = 2.0
    refresh_interval: float = 10.0
    #: the coordinator decides this often; its lease lasts lease_ttl (renewed each tick)
    coordinator_interval: float = 1.0
    lease_ttl: float = 5.0
    #: a coordinator beat older than this (server clock) means the coordinator is lost
    coordinator_stale_after: float = 15.0
    #: a worker keeps its last list this long after it was last fresh, then goes local
    keep_last_for: float = 60.0

    def __post_init__(self) -> None:
        for name in ("window_seconds", "slow_call_duration", "healthy_period", "probe_rate",
                     "push_interval", "refresh_interval", "coordinator_interval", "lease_ttl",
                     "coordinator_stale_after", "keep_last_for"):
            v = getattr(self, name)
            _check(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                   and v > 0, name, f"must be a positive number, got {v!r}")
        for name in ("bucket_seconds", "minimum_calls", "probe_minimum"):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name,
                   f"must be a positive integer, got {v!r}")
        for name in ("failure_rate_threshold", "slow_call_rate_threshold", "healthy_rate"):
            v = getattr(self, name)
            _check(isinstance(v, int | float) and 0 < v <= 1, name,
                   f"must be a fraction in (0, 1], got {v!r}")
        _check(self.bucket_seconds <= self.window_seconds, "bucket_seconds",
               "must be at most window_seconds")
        _check(self.healthy_rate < self.failure_rate_threshold, "healthy_rate",
               "must be below failure_rate_threshold (or a provider would flap)")
        _check(self.lease_ttl > self.coordinator_interval, "lease_ttl",
               "must be longer than coordinator_interval (the lease is renewed each tick)")
        _check(self.coordinator_stale_after > self.coordinator_interval,
               "coordinator_stale_after", "must be longer than coordinator_interval")

    @classmethod
    def from_spec(cls, spec: str | None) -> CircuitSettings:
        """The defaults, with the fields a ``MYDATA_CIRCUIT`` spec sets, e.g.
        ``healthy_period=10;refresh_interval=2`` (ConfigError naming a bad field)."""
        if not spec or not spec.strip():
            return cls()
        known = {f.name: f for f in fields(cls)}
        values: dict[str, float | int] = {}
        for item in spec.split(";"):
            if not item.strip():
                continue
            name, eq, raw = item.partition("=")
            name = name.strip()
            if not eq or name not in known:
                raise ConfigError(f"MYDATA_CIRCUIT: {item.strip()!r} is not <field>=<value> "
                                  f"(fields: {', '.join(known)})", field="MYDATA_CIRCUIT")
            ints = name in ("bucket_seconds", "minimum_calls", "probe_minimum")
            try:
                values[name] = int(raw) if ints else float(raw)
            except ValueError:
                raise ConfigError(f"MYDATA_CIRCUIT: {name} must be a number, got {raw!r}",
                                  field=f"circuit.{name}") from None
        return cls(**values)  # type: ignore[arg-type]

    @property
    def history_seconds(self) -> float:
        """How far back the coordinator reads counts (the longer of its two periods)."""
        return max(self.window_seconds, self.healthy_period)

    @property
    def history_buckets(self) -> int:
        """Buckets read per decision: every bucket that overlaps the history, plus one."""
        return math.ceil(self.history_seconds / self.bucket_seconds) + 1

    @property
    def probe_interval(self) -> float:
        """The cluster-wide spacing of probe calls (one reservation each)."""
        return 1.0 / self.probe_rate


@dataclass(frozen=True, slots=True)
class Counts:
    """Calls to one provider: successes, failures (faults, timeouts), slow calls."""

    successes: int = 0
    failures: int = 0
    slow: int = 0

    def __post_init__(self) -> None:
        if self.successes < 0 or self.failures < 0 or self.slow < 0:
            raise ValueError(f"counts must be >= 0, got {self}")

    @property
    def calls(self) -> int:
        return self.successes + self.failures

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.successes + other.successes, self.failures + other.failures,
                      self.slow + other.slow)

    @property
    def failure_rate(self) -> float:
        return self.failures / self.calls if self.calls else 0.0

    @property
    def slow_rate(self) -> float:
        return self.slow / self.calls if self.calls else 0.0


def count_of(event: CallFinished, slow_call_duration: float) -> Counts | None:
    """What one finished call adds to its provider's counts; None for a neutral one (our
    refusals, consent and client problems, throttling), as for the local breaker. A call is
    slow when its slowest attempt took ``slow_call_duration`` or more, as for the local
    breaker: our own waits (a busy worker, a binding limit) never make a provider slow."""
    kind = event.outcome.kind
    if kind is Kind.SUCCESS:
        c = Counts(successes=1)
    elif kind is Kind.FAULT or kind is Kind.TIMEOUT:
        c = Counts(failures=1)
    else:
        return None
    if event.slowest >= slow_call_duration:
        c = Counts(c.successes, c.failures, 1)
    return c


def window_totals(buckets: Mapping[int, Counts], *, now: float, seconds: float,
                  bucket_seconds: int, since: float | None = None) -> Counts:
    """The counts of every bucket overlapping the last ``seconds`` before ``now`` (and, with
    ``since``, ending after it). Bucket ``b`` holds the calls pushed in ``[b, b + size)``."""
    lo = now - seconds
    if since is not None and since > lo:
        lo = since
    total = Counts()
    for start, c in buckets.items():
        if start + bucket_seconds > lo and start <= now:
            total = total + c
    return total


@dataclass(frozen=True, slots=True)
class Forced:
    """An operator's override of one provider's circuit."""

    state: CircuitState
    reason: str
    since: float
    actor: str = ""

    def __post_init__(self) -> None:
        if self.state not in (CircuitState.FORCED_OPEN, CircuitState.FORCED_CLOSED):
            raise ValueError(f"a forced state is forced_open or forced_closed, "
                             f"got {self.state!r}")
        if not self.reason.strip():
            raise ValueError("a forced state needs a reason")


@dataclass(frozen=True, slots=True)
class ProviderCircuit:
    """One provider's cluster state, why, since when (server epoch seconds), and the rates
    the coordinator last saw."""

    org_code: str
    state: CircuitState
    since: float
    reason: str
    failure_rate: float = 0.0
    slow_rate: float = 0.0
    calls: int = 0
    generation: int = 0

    def to_json(self) -> dict[str, object]:
        return {"org_code": self.org_code, "state": str(self.state), "since": self.since,
                "reason": self.reason, "failure_rate": round(self.failure_rate, 4),
                "slow_rate": round(self.slow_rate, 4), "calls": self.calls,
                "generation": self.generation}

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> ProviderCircuit:
        def num(key: str) -> float:
            v = raw.get(key, 0)
            return float(v) if isinstance(v, int | float | str) else 0.0
        return cls(org_code=str(raw["org_code"]), state=CircuitState(str(raw["state"])),
                   since=num("since"), reason=str(raw.get("reason", "")),
                   failure_rate=num("failure_rate"), slow_rate=num("slow_rate"),
                   calls=int(num("calls")), generation=int(num("generation")))


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def decide(org_code: str, current: ProviderCircuit | None, buckets: Mapping[int, Counts], *,
           now: float, forced: Forced | None, settings: CircuitSettings,
           generation: int = 0) -> ProviderCircuit:
    """The provider's cluster state at server time ``now``; ``current`` is the last one
    written (None: never seen, i.e. closed)."""
    st = settings
    window = window_totals(buckets, now=now, seconds=st.window_seconds,
                           bucket_seconds=st.bucket_seconds)

    def keep(c: ProviderCircuit) -> ProviderCircuit:
        return ProviderCircuit(org_code, c.state, c.since, c.reason, window.failure_rate,
                               window.slow_rate, window.calls, generation)

    def to(state: CircuitState, reason: str, since: float = now) -> ProviderCircuit:
        return ProviderCircuit(org_code, state, since, reason, window.failure_rate,
                               window.slow_rate, window.calls, generation)

    if forced is not None:
        if current is not None and current.state is forced.state \
                and current.since == forced.since:
            return keep(current)
        return to(forced.state, f"forced by {forced.actor or 'operator'}: {forced.reason}",
                  forced.since)
    if current is None:
        current = to(CircuitState.CLOSED, "no calls seen yet")
    elif current.state in (CircuitState.FORCED_OPEN, CircuitState.FORCED_CLOSED):
        # Released: start closed, judged afresh on the calls made from now on.
        return to(CircuitState.CLOSED, "force released")
    if current.state is CircuitState.CLOSED:
        if window.calls >= st.minimum_calls:
            if window.failure_rate >= st.failure_rate_threshold:
                return to(CircuitState.OPEN, f"failure rate {_pct(window.failure_rate)} of "
                          f"{window.calls} calls in {st.window_seconds:g} s")
            if window.slow_rate >= st.slow_call_rate_threshold:
                return to(CircuitState.OPEN, f"slow-call rate {_pct(window.slow_rate)} of "
                          f"{window.calls} calls in {st.window_seconds:g} s")
        return keep(current)
    # OPEN: only probes reach it; close after a healthy period of them.
    if now - current.since >= st.healthy_period:
        recent = window_totals(buckets, now=now, seconds=st.healthy_period,
                               bucket_seconds=st.bucket_seconds)
        if (recent.calls >= st.probe_minimum and recent.failure_rate <= st.healthy_rate
                and recent.slow_rate <= st.healthy_rate):
            return to(CircuitState.CLOSED, f"healthy for {st.healthy_period:g} s "
                      f"({recent.calls} probes, {_pct(recent.failure_rate)} failed)")
    return keep(current)


def changed(old: ProviderCircuit | None, new: ProviderCircuit) -> bool:
    """A transition worth an event (state or its since moved), not a new rate reading."""
    if old is None:
        return new.state is not CircuitState.CLOSED
    return old.state is not new.state or old.since != new.since


def view_mode(*, now: float, fresh_at: float | None, fresh: bool,
              keep_last_for: float) -> ViewMode:
    """Where a worker's verdicts come from at monotonic ``now``: ``fresh_at`` is when its
    last fresh list was read, ``fresh`` whether its latest read was fresh."""
    if fresh_at is None:
        return ViewMode.LOCAL
    if fresh:
        return ViewMode.CLUSTER
    return ViewMode.STALE if now - fresh_at <= keep_last_for else ViewMode.LOCAL


def probe_workers(live: Iterable[str]) -> frozenset[str]:
    """The designated probe workers: the oldest and the newest live worker (``live`` ordered
    by start), so one of them survives a rolling deploy."""
    order = list(live)
    if not order:
        return frozenset()
    return frozenset({order[0], order[-1]})


class ProbePacer:
    """A probe worker's own pacing of refresh starts to an open provider (the Redis
    reservation is the cluster-wide bound; this only spares the database the claims that
    would be refused)."""

    __slots__ = ("_interval", "_next")

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._next = -math.inf

    def take(self, now: float) -> bool:
        """True (and the next one an interval later) if a probe start is due at ``now``."""
        if now < self._next:
            return False
        self._next = now + self._interval
        return True
