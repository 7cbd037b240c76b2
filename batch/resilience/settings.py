"""Settings for each layer of the chain, validated once at the edge.

``ChainSettings.from_provider`` builds them from an institutions-file provider: the rate from
``calls_per_second``, the bulkhead from ``max_concurrency``, timeouts from the provider's
timeouts, and optional per-layer overrides from ``provider.extra`` (``[providers.breaker]``,
``retry``, ``limiter``, ``bulkhead``, ``timeouts`` tables). Every error names the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TypeVar

from batch.config import Provider
from batch.errors import ConfigError

#: a call this long is slow (a few seconds: a healthy provider answers in 150-300 ms)
SLOW_CALL_SECONDS = 5.0


class WindowType(StrEnum):
    COUNT = "count"  # the last ``window_size`` calls
    TIME = "time"    # the calls of the last ``window_size`` seconds, in 1-second buckets


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0):
        raise ConfigError(f"must be a positive number, got {value!r}", field=name)


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):
        raise ConfigError(f"must be a number >= 0, got {value!r}", field=name)


def _positive_int(name: str, value: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"must be a positive integer, got {value!r}", field=name)


def _fraction(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value <= 1):
        raise ConfigError(f"must be a fraction in (0, 1], got {value!r}", field=name)


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """When the circuit opens, how long it stays open, and how it probes its way back.

    The defaults stop the calls to a provider that went down within about 10 s whatever
    its call rate: the window is the last 10 seconds (not the last N calls, which at a
    low rate takes minutes to fill), a verdict needs only 5 calls in it, and a run of
    ``consecutive_down`` answers saying the provider is down (50005, connection refused)
    trips it on their own. A provider slowing from 200 ms to 15 s trips it too: a call
    of 5 s or more is slow, and 60 % slow calls in the window is an incident.
    """

    window_type: WindowType = WindowType.TIME
    #: calls (count window) or seconds (time window)
    window_size: int = 10
    #: no verdict before this many calls are in the window
    minimum_calls: int = 5
    failure_rate_threshold: float = 0.5
    slow_call_rate_threshold: float = 0.6
    #: a call whose slowest attempt took at least this long is slow
    slow_call_duration: float = SLOW_CALL_SECONDS
    #: this many "provider down" outcomes in a row (50005, connection refused: see
    #: ``Outcome.is_down``) trip the circuit whatever the window holds
    consecutive_down: int = 5
    #: first OPEN wait; each re-trip without closing in between multiplies it, up to the max
    open_wait: float = 30.0
    open_wait_multiplier: float = 2.0
    open_wait_max: float = 300.0
    half_open_permits: int = 5
    #: HALF_OPEN longer than this without a verdict goes back to OPEN
    half_open_max_time: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.window_type, WindowType):
            try:
                object.__setattr__(self, "window_type", WindowType(self.window_type))
            except ValueError:
                raise ConfigError("must be 'count' or 'time'",
                                  field="breaker.window_type") from None
        _positive_int("breaker.window_size", self.window_size)
        if self.window_type is WindowType.TIME and self.window_size > 3600:
            raise ConfigError("a time window is at most 3600 seconds",
                              field="breaker.window_size")
        _positive_int("breaker.minimum_calls", self.minimum_calls)
        _positive_int("breaker.consecutive_down", self.consecutive_down)
        _fraction("breaker.failure_rate_threshold", self.failure_rate_threshold)
        _fraction("breaker.slow_call_rate_threshold", self.slow_call_rate_threshold)
        _positive("breaker.slow_call_duration", self.slow_call_duration)
        _positive("breaker.open_wait", self.open_wait)
        _positive("breaker.open_wait_multiplier", self.open_wait_multiplier)
        if self.open_wait_multiplier < 1:
            raise ConfigError("must be >= 1 (the wait never shrinks on a re-trip)",
                              field="breaker.open_wait_multiplier")
        _positive("breaker.open_wait_max", self.open_wait_max)
        if self.open_wait_max < self.open_wait:
            raise ConfigError("must be >= breaker.open_wait", field="breaker.open_wait_max")
        _positive_int("breaker.half_open_permits", self.half_open_permits)
        _positive("breaker.half_open_max_time", self.half_open_max_time)

    def open_wait_for(self, trips: int) -> float:
        """The OPEN wait after the ``trips``-th consecutive trip (1 = first)."""
        wait = self.open_wait * self.open_wait_multiplier ** min(trips - 1, 64)
        return min(wait, self.open_wait_max)


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Which attempts are retried, how long to wait between them, and the retry budget."""

    #: attempts per logical call, the first included (1 = never retry)
    max_attempts: int = 3
    backoff_base: float = 0.2
    backoff_multiplier: float = 2.0
    backoff_max: float = 5.0
    #: retries at most ``budget_ratio`` of the calls started in the last ``budget_window`` s ...
    budget_ratio: float = 0.2
    budget_window: int = 10
    #: ... plus this many retries per window, so a quiet provider can still retry
    budget_floor: int = 3
    #: a retry is skipped unless at least this long is left before the deadline after its
    #: backoff: an attempt cut short by the deadline would only turn a known fault into an
    #: unknown timeout
    min_attempt_time: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("retry.max_attempts", self.max_attempts)
        _non_negative("retry.min_attempt_time", self.min_attempt_time)
        _positive("retry.backoff_base", self.backoff_base)
        _positive("retry.backoff_multiplier", self.backoff_multiplier)
        if self.backoff_multiplier < 1:
            raise ConfigError("must be >= 1", field="retry.backoff_multiplier")
        _positive("retry.backoff_max", self.backoff_max)
        _non_negative("retry.budget_ratio", self.budget_ratio)
        _positive_int("retry.budget_window", self.budget_window)
        if self.budget_window > 3600:
            raise ConfigError("at most 3600 seconds", field="retry.budget_window")
        if not (isinstance(self.budget_floor, int) and not isinstance(self.budget_floor, bool)
                and self.budget_floor >= 0):
            raise ConfigError(f"must be an integer >= 0, got {self.budget_floor!r}",
                              field="retry.budget_floor")

    def backoff_cap(self, retry: int) -> float:
        """The upper bound of the full-jitter wait before the ``retry``-th retry (1 = first)."""
        return min(self.backoff_max,
                   self.backoff_base * self.backoff_multiplier ** min(retry - 1, 64))


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    """An even spread of calls (GCRA) with a small burst, a maximum wait and adaptive back-off."""

    calls_per_second: float = 50.0
    #: calls that may go back to back before the spacing applies
    burst: int = 1
    #: a call that would wait longer than this is rejected (not counted, not retried)
    max_wait: float = 5.0
    #: on 42902 (or HTTP 429) the rate is multiplied by this ...
    throttle_factor: float = 0.5
    #: ... never below this fraction of the configured rate ...
    min_rate_fraction: float = 0.1
    #: ... held this long, then recovers linearly over ``recovery_time`` seconds
    throttle_hold: float = 30.0
    recovery_time: float = 60.0
    #: 40301/40302: the provider is paused this long
    pause: float = 10.0
    #: a Retry-After longer than this is capped
    retry_after_max: float = 120.0

    def __post_init__(self) -> None:
        _positive("limiter.calls_per_second", self.calls_per_second)
        _positive_int("limiter.burst", self.burst)
        _non_negative("limiter.max_wait", self.max_wait)
        _fraction("limiter.throttle_factor", self.throttle_factor)
        _fraction("limiter.min_rate_fraction", self.min_rate_fraction)
        _non_negative("limiter.throttle_hold", self.throttle_hold)
        _positive("limiter.recovery_time", self.recovery_time)
        _non_negative("limiter.pause", self.pause)
        _non_negative("limiter.retry_after_max", self.retry_after_max)


@dataclass(frozen=True, slots=True)
class BulkheadSettings:
    """At most ``max_concurrent`` calls in flight; a caller waits at most ``max_wait``."""

    max_concurrent: int = 20
    max_wait: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("bulkhead.max_concurrent", self.max_concurrent)
        _non_negative("bulkhead.max_wait", self.max_wait)


@dataclass(frozen=True, slots=True)
class TimeoutSettings:
    """Connect and read timeouts of one HTTP attempt, and the total deadline of a call."""

    connect_timeout: float = 3.0
    read_timeout: float = 20.0
    call_deadline: float = 45.0
    #: one attempt as a whole (default connect + read)
    attempt_timeout: float | None = None

    def __post_init__(self) -> None:
        _positive("timeouts.connect_timeout", self.connect_timeout)
        _positive("timeouts.read_timeout", self.read_timeout)
        _positive("timeouts.call_deadline", self.call_deadline)
        if self.attempt_timeout is None:
            object.__setattr__(self, "attempt_timeout",
                               self.connect_timeout + self.read_timeout)
        else:
            _positive("timeouts.attempt_timeout", self.attempt_timeout)

    @property
    def per_attempt(self) -> float:
        assert self.attempt_timeout is not None
        return self.attempt_timeout


_S = TypeVar("_S", BreakerSettings, RetrySettings, LimiterSettings, BulkheadSettings,
             TimeoutSettings)


def _with_overrides(base: _S, section: str, raw: object) -> _S:
    """``base`` with the keys of ``raw`` replaced; unknown keys are an error naming them."""
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a table of settings", field=section)
    known = {f.name for f in fields(base)}
    values = {name: getattr(base, name) for name in known}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"unknown setting (known: {', '.join(sorted(known))})",
                              field=f"{section}.{key}")
        values[key] = value
    try:
        return type(base)(**values)
    except TypeError as exc:  # a wrong type that the comparisons in validation tripped on
        raise ConfigError(f"bad value: {exc}", field=section) from None


@dataclass(frozen=True, slots=True)
class ChainSettings:
    """Everything one provider's chain needs."""

    breaker: BreakerSettings = BreakerSettings()
    retry: RetrySettings = RetrySettings()
    limiter: LimiterSettings = LimiterSettings()
    bulkhead: BulkheadSettings = BulkheadSettings()
    timeouts: TimeoutSettings = TimeoutSettings()

    @classmethod
    def from_provider(cls, provider: Provider) -> ChainSettings:
        """Settings from an institutions-file provider plus its optional override tables."""
        try:
            return cls._from_provider(provider)
        except ConfigError as exc:
            raise ConfigError(f"{exc.reason} (provider {provider.org_code})",
                              field=exc.field) from None

    @classmethod
    def _from_provider(cls, provider: Provider) -> ChainSettings:
        extra = provider.extra
        timeouts = _with_overrides(
            TimeoutSettings(connect_timeout=provider.connect_timeout,
                            read_timeout=provider.read_timeout,
                            call_deadline=provider.call_deadline),
            "timeouts", extra.get("timeouts"))
        # a call is slow long before it times out (a slow call that would only count
        # once it timed out is a failure, not a warning)
        slow = min(SLOW_CALL_SECONDS, timeouts.read_timeout / 2)
        breaker = _with_overrides(BreakerSettings(slow_call_duration=slow),
                                  "breaker", extra.get("breaker"))
        retry = _with_overrides(RetrySettings(), "retry", extra.get("retry"))
        limiter = _with_overrides(
            LimiterSettings(calls_per_second=provider.calls_per_second),
            "limiter", extra.get("limiter"))
        bulkhead = _with_overrides(
            BulkheadSettings(max_concurrent=provider.max_concurrency),
            "bulkhead", extra.get("bulkhead"))
        return cls(breaker=breaker, retry=retry, limiter=limiter, bulkhead=bulkhead,
                   timeouts=timeouts)
