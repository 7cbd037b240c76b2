"""Retry decisions: which outcomes to retry, how long to wait, and the per-provider budget.

Only a transient provider fault (``Kind.FAULT`` with ``retryable``) is retried; a timeout or
50003 (outcome unknown), a 4xx, throttling and our own rejections never are. Waits are
exponential with full jitter (``random() * cap``), the random source injected so tests pin
the exact waits. The budget keeps retries to a share of the calls started in a rolling
window plus a small floor, so a provider that fails hard gets no retry storm.
"""

from __future__ import annotations

from collections.abc import Callable

from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import RetrySettings
from batch.resilience.window import Counter2


def is_retryable(outcome: Outcome) -> bool:
    """A transient provider fault: a connection error, 50001/2/4/5, a bare HTTP 5xx."""
    return outcome.kind is Kind.FAULT and outcome.retryable


class Backoff:
    """Full-jitter exponential waits: before retry n, ``random() * min(max, base * m**(n-1))``."""

    __slots__ = ("_random", "settings")

    def __init__(self, settings: RetrySettings, random: Callable[[], float]) -> None:
        self.settings = settings
        self._random = random

    def wait(self, retry: int) -> float:
        return self._random() * self.settings.backoff_cap(retry)


class RetryBudget:
    """Retries <= ``ratio`` x calls + ``floor`` over the last ``window`` seconds."""

    __slots__ = ("_counts", "floor", "note_call", "ratio")

    def __init__(self, settings: RetrySettings) -> None:
        self.ratio = settings.budget_ratio
        self.floor = settings.budget_floor
        self._counts = Counter2(settings.budget_window)  # a = calls, b = retries
        #: ``note_call(now)``: a logical call started (the window's own method: every call
        #: counts one, a frame less)
        self.note_call: Callable[[float], None] = self._counts.add_a

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget if there is one left."""
        c = self._counts
        c.expire(now)
        if c.b + 1 > self.ratio * c.a + self.floor:
            return False
        c.add_b(now)
        return True

    def available(self, now: float) -> int:
        """Retries left in the budget now."""
        c = self._counts
        c.expire(now)
        return max(0, int(self.ratio * c.a + self.floor) - c.b)

    def counts(self, now: float) -> tuple[int, int]:
        """(calls, retries) in the window."""
        c = self._counts
        c.expire(now)
        return c.a, c.b
