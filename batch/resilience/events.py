"""Events the chain emits, and the listener hook that metrics and logs attach to.

Every event carries the provider's ``org_code`` and, when one exists, the ``x-api-tran-id``
of the attempt it concerns. A listener that raises is logged and ignored: observing a call
must never break it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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

#: one provider's end of every call, as its fields: ``sink(tran_id, outcome, attempts,
#: duration)`` (a :class:`CallFinished` without the object; see :class:`Listener`)
CallSink = Callable[[str | None, Outcome, int, float], None]


class Listener(Protocol):
    """Anything called with each event (a metrics sink, a logger, a test's list.append).

    A listener that wants only some kinds of event names them in a ``hears`` attribute (a
    set of event classes); one without it hears them all. The emitter then never calls it
    with the others: the chain's :class:`CallFinished`, one per call, goes only to the
    listeners that hear it (the event log does not: a call's end is the recorder's).

    A listener of :class:`CallFinished` may also have a ``call_sink(org_code)`` method
    that returns a :data:`CallSink` bound to that provider: a provider's chain then calls
    the sink with each call's fields instead of building a CallFinished for it and calling
    the listener, which looked the provider up again. The recorder's metrics of every call
    cost 3.5 us of our 22 a call in ``test_dispatch_in_process.py`` (2026-12-06, runs with
    and without it); through its sink, ``test_chain_overhead.py``'s metrics cost went from
    1.8-2.0 to 1.0-1.2 us a call (three rounds alternated with the event). An emitter made
    without the provider calls it with events as before."""

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
    logged, never raised. Made for one provider (``org_code``), it takes the call sinks of
    the listeners that offer one (see :class:`Listener`)."""

    __slots__ = ("_by_type", "active", "calls", "ends", "listeners", "sink", "sinks")

    def __init__(self, listeners: Sequence[Listener] = (), *,
                 org_code: str | None = None) -> None:
        self.listeners = tuple(listeners)
        #: False when nobody listens, so the hot path skips building events at all
        self.active = bool(self.listeners)
        self._by_type: dict[type, tuple[Listener, ...]] = {
            kind: tuple(direct_call(x) for x in self.listeners if hears(x, kind))
            for kind in EVENT_TYPES}
        calls: list[Listener] = []
        sinks: list[CallSink] = []
        for x in self.listeners:
            if not hears(x, CallFinished):
                continue
            make = getattr(x, "call_sink", None) if org_code is not None else None
            if make is not None:
                sinks.append(make(org_code))
            else:
                calls.append(direct_call(x))
        #: the listeners of :class:`CallFinished` that are called with one (empty: the
        #: chain does not build it)
        self.calls: tuple[Listener, ...] = tuple(calls)
        #: the call sinks, called with a call's fields
        self.sinks: tuple[CallSink, ...] = tuple(sinks)
        #: the one sink when it is all a call's end goes to (the chain calls it itself)
        self.sink: CallSink | None = sinks[0] if len(sinks) == 1 and not calls else None
        #: whether a call's end goes anywhere (:meth:`ended`)
        self.ends = bool(calls or sinks)

    def __call__(self, event: Event) -> None:
        for listener in self._by_type.get(type(event), self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("resilience listener %r failed on %s", listener,
                              type(event).__name__)

    def finished(self, event: CallFinished) -> None:
        """:meth:`__call__` for the event of every call (no lookup by kind), to the
        listeners that are called with one (not the sinks: :meth:`ended`)."""
        for listener in self.calls:
            try:
                listener(event)
            except Exception:
                log.exception("resilience listener %r failed on CallFinished", listener)

    def ended(self, org_code: str, tran_id: str | None, outcome: Outcome, attempts: int,
              duration: float, slowest: float = 0.0) -> None:
        """A call's end: to each sink as its fields, and as one :class:`CallFinished` to
        the listeners called with one."""
        for sink in self.sinks:
            try:
                sink(tran_id, outcome, attempts, duration)
            except Exception:
                self.sink_failed(sink)
        if self.calls:
            self.finished(CallFinished(org_code, tran_id, outcome, attempts, duration,
                                       slowest))

    @staticmethod
    def sink_failed(sink: CallSink) -> None:
        """Log a sink's error (called from the ``except`` around it)."""
        log.exception("resilience listener's call sink %r failed", sink)
