"""Events the chain emits, and the listener hook that metrics and logs attach to.

Every event carries the provider's ``org_code`` and, when one exists, the ``x-api-tran-id``
of the attempt it concerns. A listener that raises is logged and ignored: observing a call
must never break it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from batch.fastinit import direct_call, fast_init
from batch.resilience.outcomes import Kind, Layer, Outcome

log = logging.getLogger("batch.resilience")


@fast_init
@dataclass(frozen=True, slots=True)
class StateChanged:
    """The breaker moved from one state to another."""

    org_code: str
    old: str
    new: str
    at: float
    reason: str
    tran_id: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """A failed attempt will be retried after ``delay`` seconds; ``elapsed`` is how long
    that attempt took (the provider's time: a retry storm's slow attempts)."""

    org_code: str
    tran_id: str | None
    attempt: int
    delay: float
    kind: Kind
    rsp_code: str | None
    elapsed: float = 0.0


@fast_init
@dataclass(frozen=True, slots=True)
class RetrySkipped:
    """A retryable fault was not retried, and why (budget, deadline, breaker, attempts)."""

    org_code: str
    tran_id: str | None
    attempt: int
    reason: str


@fast_init
@dataclass(frozen=True, slots=True)
class Rejected:
    """One of our own layers refused a call or an attempt before it reached the provider."""

    org_code: str
    layer: Layer
    detail: str
    tran_id: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class CallFinished:
    """A logical call ended with ``outcome`` after ``attempts`` attempts. ``duration`` is
    the whole call, our own waits (limiter, bulkhead, backoff) included; ``slowest`` its
    longest attempt: the provider's time, what a slow call is judged on."""

    org_code: str
    tran_id: str | None
    outcome: Outcome
    attempts: int
    duration: float
    slowest: float = 0.0


@fast_init
@dataclass(frozen=True, slots=True)
class RateAdjusted:
    """The limiter's rate changed (throttled, paused or recovered)."""

    org_code: str
    rate: float
    base_rate: float
    reason: str
    until: float | None = None
    tran_id: str | None = None


Event = StateChanged | RetryScheduled | RetrySkipped | Rejected | CallFinished | RateAdjusted


class Listener(Protocol):
    """Anything called with each event (a metrics sink, a logger, a test's list.append).

    A listener that wants only some kinds of event names them in a ``hears`` attribute (a
    set of event classes); one without it hears them all. The emitter then never calls it
    with the others: the chain's :class:`CallFinished`, one per call, goes only to the
    listeners that hear it (the event log does not: a call's end is the recorder's)."""

    def __call__(self, event: Event, /) -> None: ...


#: every kind of event, in the order of :data:`Event`
EVENT_TYPES: tuple[type, ...] = (StateChanged, RetryScheduled, RetrySkipped, Rejected,
                                 CallFinished, RateAdjusted)


def hears(listener: Listener, kind: type) -> bool:
    """Whether ``listener`` wants events of class ``kind`` (see :class:`Listener`)."""
    wanted = getattr(listener, "hears", None)
    return wanted is None or kind in wanted


class Emitter:
    """Delivers each event to every listener that hears its kind; a listener's error is
    logged, never raised."""

    __slots__ = ("_by_type", "active", "calls", "listeners")

    def __init__(self, listeners: Sequence[Listener] = ()) -> None:
        self.listeners = tuple(listeners)
        #: False when nobody listens, so the hot path skips building events at all
        self.active = bool(self.listeners)
        self._by_type: dict[type, tuple[Listener, ...]] = {
            kind: tuple(direct_call(x) for x in self.listeners if hears(x, kind))
            for kind in EVENT_TYPES}
        #: the listeners of :class:`CallFinished` (empty: the chain does not build it)
        self.calls = self._by_type[CallFinished]

    def __call__(self, event: Event) -> None:
        for listener in self._by_type.get(type(event), self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("resilience listener %r failed on %s", listener,
                              type(event).__name__)

    def finished(self, event: CallFinished) -> None:
        """:meth:`__call__` for the event of every call (no lookup by kind)."""
        for listener in self.calls:
            try:
                listener(event)
            except Exception:
                log.exception("resilience listener %r failed on CallFinished", listener)
