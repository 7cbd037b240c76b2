"""The per-provider resilience chain.

CircuitBreaker(Retry(RateLimiter(Bulkhead(timeout(call))))): one chain per provider.
"""

from __future__ import annotations

from batch.resilience.breaker import CircuitBreaker, State
from batch.resilience.chain import Attempt, ProviderChain
from batch.resilience.events import (
    CallFinished,
    Event,
    Listener,
    RateAdjusted,
    Rejected,
    RetryScheduled,
    RetrySkipped,
    StateChanged,
)
from batch.resilience.settings import (
    BreakerSettings,
    BulkheadSettings,
    ChainSettings,
    LimiterSettings,
    RetrySettings,
    TimeoutSettings,
    WindowType,
)

__all__ = [
    "Attempt",
    "BreakerSettings",
    "BulkheadSettings",
    "CallFinished",
    "ChainSettings",
    "CircuitBreaker",
    "Event",
    "LimiterSettings",
    "Listener",
    "ProviderChain",
    "RateAdjusted",
    "Rejected",
    "RetryScheduled",
    "RetrySettings",
    "RetrySkipped",
    "State",
    "StateChanged",
    "TimeoutSettings",
    "WindowType",
]
