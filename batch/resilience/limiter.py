"""The rate limiter: GCRA spacing of calls, a small burst, a maximum wait, adaptive back-off.

Each call reserves the next slot on a theoretical arrival time (TAT) and waits until its
slot: after the burst, no two calls are closer than ``1 / rate``. A call whose slot is more
than the maximum wait away is refused and reserves nothing. When the provider throttles us
(42902, HTTP 429) the rate drops by a factor for a while and then climbs back linearly;
40301/40302 or a Retry-After pause the provider outright.
"""

from __future__ import annotations

from typing import Protocol

from batch.clock import Clock
from batch.resilience.events import Emitter, RateAdjusted
from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import LimiterSettings

#: after lowering the rate, further 42902s within this many seconds (answers to calls
#: already in flight) do not lower it again
DECREASE_GAP = 1.0
#: ``reserve``: no shared permit in stock (cluster mode); the chain waits for a refill
NO_PERMIT = -2.0
#: a call sent later than its slot by more than ``LATE_SHARE`` of the interval (and at
#: least ``LATE_MIN`` seconds) gives the slot up and takes the next one, once: late calls
#: sent at once after a stall of the event loop would bunch above the rate. Calls within an
#: interval of their slots keep any 1-second window within the rate plus the burst; above
#: 1 / (2 * LATE_MIN) calls/s (100/s) a call may be LATE_MIN late: at most rate * LATE_MIN
#: more calls in a second (0.5 %), what an event loop's timers can hold.
LATE_SHARE = 0.5
LATE_MIN = 0.005
_PAUSE_CODES = frozenset({"40301", "40302"})


class SharedPermits(Protocol):
    """Cluster mode's shared limit behind the local one (batch/cluster/permits.py): permits
    reserved ahead from the cluster-wide GCRA, handed out one per call."""

    def take(self, now: float) -> float | None:
        """The monotonic time of this call's shared slot (<= a fraction of a second away),
        or None: no permit in stock (nothing reserved locally)."""

    async def refilled(self, clock: Clock, seconds: float) -> bool:
        """Wait up to ``seconds`` for the next permits to arrive; False if none came (the
        call is refused)."""

    def throttled(self, now: float) -> None:
        """A 42902/429 was seen here: lower the shared rate for the whole cluster."""


class RateLimiter:
    __slots__ = (
        "_emit", "_factor", "_hold_until", "_interval", "_last_decrease", "_low",
        "_paused_until", "_share", "_tat", "_tau", "base_rate", "late_slots",
        "late_tolerance", "max_wait", "org_code", "settings", "shared",
    )

    def __init__(self, settings: LimiterSettings, *, org_code: str = "",
                 emit: Emitter | None = None) -> None:
        self.settings = settings
        self.org_code = org_code
        self._emit = emit if emit is not None else Emitter()
        self.base_rate = settings.calls_per_second
        self.max_wait = settings.max_wait
        self._tat = float("-inf")
        self._factor = 1.0
        self._low = 1.0
        self._hold_until = 0.0
        self._last_decrease = float("-inf")
        self._paused_until = float("-inf")
        self._interval = 0.0
        self._tau = 0.0
        self._share = 1.0
        self.late_tolerance = LATE_MIN
        #: calls that gave up a slot they reached too late (see :meth:`late`)
        self.late_slots = 0
        #: cluster mode: the shared limit this local one stands in front of (None: local only)
        self.shared: SharedPermits | None = None
        self._set_factor(1.0)

    # ------------------------------------------------------------------ per call
    def reserve(self, now: float, max_wait: float) -> float:
        """Seconds to wait for this call's slot (>= 0), or -1.0: refused, nothing reserved;
        NO_PERMIT: refused for want of a shared permit (cluster mode), nothing reserved."""
        if self._factor != 1.0:
            self._recover(now)
        tat = self._tat
        if tat < now:
            tat = now
        wait = tat - self._tau - now
        if wait > max_wait:
            return -1.0
        shared = self.shared
        if shared is not None:  # cluster mode: a shared permit too, at the later slot
            slot = shared.take(now)
            if slot is None:
                return NO_PERMIT
            if slot - now > wait:
                wait = slot - now
        self._tat = tat + self._interval
        return wait if wait > 0.0 else 0.0

    def late(self, slot_at: float, now: float) -> bool:
        """Is a call whose slot was ``slot_at`` too late to be sent at ``now``? Then the
        slot is lost (counted in ``late_slots``) and the call reserves the next one: the
        provider sees the calls spaced as reserved, never a stall's backlog at once."""
        if now - slot_at <= self.late_tolerance:
            return False
        self.late_slots += 1
        return True

    def hold(self, until: float) -> None:
        """No slot before ``until`` (a monotonic time); the spacing from there on. Cluster
        mode, Redis lost: the shared permits other workers hold still run out."""
        if until + self._tau > self._tat:
            self._tat = until + self._tau

    @property
    def interval(self) -> float:
        """Seconds between two calls at the rate in force."""
        return self._interval

    def set_share(self, share: float) -> None:
        """Run at ``share`` of the configured rate (cluster mode without its shared limit:
        the rate divided among the live workers); 1.0 is the configured rate."""
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        if share == self._share:
            return
        self._share = share
        self.base_rate = self.settings.calls_per_second * share
        self._set_factor(self._factor)

    @property
    def share(self) -> float:
        return self._share

    def observe(self, outcome: Outcome, now: float) -> None:
        """Adapt to a THROTTLED answer: lower the rate (42902, 429) or pause (40301/40302)."""
        if outcome.kind is not Kind.THROTTLED:
            return
        st = self.settings
        if outcome.rsp_code in _PAUSE_CODES:
            self.pause(now, st.pause, reason=f"paused on {outcome.rsp_code}",
                       tran_id=outcome.tran_id)
        else:
            self.throttle(now, tran_id=outcome.tran_id)
            if self.shared is not None:
                self.shared.throttled(now)
        if outcome.retry_after is not None and outcome.retry_after > 0:
            self.pause(now, min(outcome.retry_after, st.retry_after_max),
                       reason="retry-after", tran_id=outcome.tran_id)

    # ------------------------------------------------------------------ adapting
    def rate(self, now: float) -> float:
        """The rate in force at ``now`` (calls per second)."""
        if self._factor != 1.0:
            self._recover(now)
        return self.base_rate * self._factor

    def next_wait(self, now: float) -> float:
        """How long a call arriving at ``now`` would wait for its slot (reserves nothing)."""
        if self._factor != 1.0:
            self._recover(now)
        return max(0.0, self._tat - self._tau - now)

    @property
    def paused_until(self) -> float | None:
        return self._paused_until if self._paused_until > float("-inf") else None

    def throttle(self, now: float, *, tran_id: str | None = None) -> None:
        """Lower the rate by ``throttle_factor`` (not below the floor) and hold it there."""
        st = self.settings
        if self._factor != 1.0:
            self._recover(now)
        self._hold_until = now + st.throttle_hold
        if now - self._last_decrease < DECREASE_GAP:
            return
        self._last_decrease = now
        low = max(st.min_rate_fraction, self._factor * st.throttle_factor)
        self._low = low
        self._set_factor(low)
        if self._emit.active:
            self._emit(RateAdjusted(self.org_code, self.base_rate * low, self.base_rate,
                                    "throttled", self._hold_until, tran_id))

    def pause(self, now: float, seconds: float, *, reason: str = "paused",
              tran_id: str | None = None) -> None:
        """No call before ``now + seconds``."""
        until = now + seconds
        if until > self._paused_until:
            self._paused_until = until
        if until + self._tau > self._tat:
            self._tat = until + self._tau
        if self._emit.active:
            self._emit(RateAdjusted(self.org_code, 0.0, self.base_rate, reason, until, tran_id))

    def _recover(self, now: float) -> None:
        hold = self._hold_until
        if now < hold:
            return
        low = self._low
        f = low + (1.0 - low) * (now - hold) / self.settings.recovery_time
        if f >= 1.0:
            self._set_factor(1.0)
            if self._emit.active:
                self._emit(RateAdjusted(self.org_code, self.base_rate, self.base_rate,
                                        "recovered"))
        else:
            self._set_factor(f)

    def _set_factor(self, f: float) -> None:
        self._factor = f
        self._interval = 1.0 / (self.base_rate * f)
        self._tau = (self.settings.burst - 1) * self._interval
        self.late_tolerance = max(LATE_MIN, LATE_SHARE * self._interval)
