"""The listener attached to every chain by default: logs what an operator must hear of.

Breaker transitions, throttling (the limiter lowering, pausing or restoring its rate) and
retry-budget exhaustion, one structured line each with ``action``, ``org_code`` and the
``x-api-tran-id`` of the call that caused it. Budget exhaustion is logged once per
provider per minute (a storm would otherwise log a line per call), with the count skipped.
"""

from __future__ import annotations

import logging

from batch.clock import Clock
from batch.observe.recorder import rate_reason
from batch.resilience.events import Event, RateAdjusted, RetrySkipped, StateChanged

log = logging.getLogger("mydata.resilience")

BUDGET_LOG_EVERY = 60.0

#: the breaker states whose arrival is a warning: calls refused, or only probes let through
_ALARMING = frozenset({"open", "half_open", "forced_open"})


class EventLog:
    """A :class:`~batch.resilience.events.Listener` that logs the events that matter."""

    __slots__ = ("_clock", "_last_budget", "_skipped", "run_id")

    #: the kinds it logs: never called with the CallFinished of every call
    hears = frozenset({StateChanged, RateAdjusted, RetrySkipped})

    def __init__(self, *, clock: Clock, run_id: str | None = None) -> None:
        self._clock = clock
        self.run_id = run_id
        self._last_budget: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, event: Event, /) -> None:
        t = type(event)
        if t is StateChanged:
            assert isinstance(event, StateChanged)
            # a warning when calls are refused or on trial; a move to closed, or to a mode
            # the run sets itself (cluster mode's metrics_only on every provider of every
            # worker at its start, a probe chain's disabled), is information
            level = logging.WARNING if event.new in _ALARMING else logging.INFO
            log.log(level, "circuit %s -> %s: %s", event.old, event.new, event.reason,
                    extra={"action": "breaker_transition", "org_code": event.org_code,
                           "run_id": self.run_id, "from_state": event.old,
                           "to_state": event.new, "tran_id": event.tran_id})
        elif t is RateAdjusted:
            assert isinstance(event, RateAdjusted)
            reason = rate_reason(event.reason)
            log.log(logging.INFO if reason == "recovered" else logging.WARNING,
                    "rate %s: %.3g of %.3g calls/s", event.reason, event.rate,
                    event.base_rate,
                    extra={"action": "rate_" + reason, "org_code": event.org_code,
                           "run_id": self.run_id, "rate": event.rate,
                           "base_rate": event.base_rate, "tran_id": event.tran_id})
        elif t is RetrySkipped:
            assert isinstance(event, RetrySkipped)
            if event.reason != "retry budget exhausted":
                return
            org = event.org_code
            now = self._clock.monotonic()
            self._skipped[org] = self._skipped.get(org, 0) + 1
            last = self._last_budget.get(org)
            if last is not None and now - last < BUDGET_LOG_EVERY:
                return
            self._last_budget[org] = now
            log.warning("retry budget exhausted: %d retries skipped", self._skipped[org],
                        extra={"action": "retry_budget_exhausted", "org_code": org,
                               "run_id": self.run_id, "skipped": self._skipped[org],
                               "tran_id": event.tran_id})
            self._skipped[org] = 0
