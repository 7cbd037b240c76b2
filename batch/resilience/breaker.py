"""The circuit breaker: one outcome per logical call decides whether the provider gets calls.

    CLOSED ──(failure or slow-call rate >= threshold, >= minimum calls)──> OPEN
    CLOSED ──(consecutive_down "provider down" outcomes in a row: 50005, refused)──> OPEN
    OPEN ──(wait over; the wait grows on each re-trip, capped)──> HALF_OPEN
    HALF_OPEN ──(N probes recorded, rates below thresholds)──> CLOSED
    HALF_OPEN ──(N probes recorded, a rate at threshold, or max time in HALF_OPEN)──> OPEN
    manual: FORCED_OPEN (refuse all), DISABLED (allow all, record nothing),
            METRICS_ONLY (allow all, record, never trip); reset() returns to CLOSED.

Neutral outcomes (our rejections, consent and client problems, throttling) are not
recorded; a neutral probe gives its half-open permit back. Time-based transitions happen
lazily, when a call asks for a permit or someone reads ``state``.
"""

from __future__ import annotations

from enum import StrEnum

from batch.clock import Clock
from batch.resilience.events import Emitter, StateChanged
from batch.resilience.outcomes import Kind, Outcome
from batch.resilience.settings import BreakerSettings, WindowType
from batch.resilience.window import FAILED, SLOW, CountWindow, TimeWindow


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    FORCED_OPEN = "forced_open"
    DISABLED = "disabled"
    METRICS_ONLY = "metrics_only"


#: try_acquire() results: refused, an ordinary call; a half-open probe is ``PROBE + epoch``.
REFUSED = 0
CALL = 1
PROBE = 2

_NEUTRAL = frozenset({Kind.REJECTED, Kind.CONSENT, Kind.CLIENT, Kind.THROTTLED})
_FAILURE = frozenset({Kind.FAULT, Kind.TIMEOUT})
_FAULT = Kind.FAULT
_SUCCESS = Kind.SUCCESS
#: members as module names on the per-call paths (``State.CLOSED`` is a 100 ns lookup)
_CLOSED = State.CLOSED
_DISABLED = State.DISABLED
_METRICS_ONLY = State.METRICS_ONLY
_OPEN = State.OPEN
_HALF_OPEN = State.HALF_OPEN
_RETRY_STATES = frozenset({State.CLOSED, State.DISABLED, State.METRICS_ONLY})
_OPEN_STATES = frozenset({State.OPEN, State.FORCED_OPEN})


class CircuitBreaker:
    """Decides per call whether to let it through and learns from each call's outcome."""

    __slots__ = (
        "_clock", "_down_run", "_emit", "_epoch", "_half_open_since", "_min_calls",
        "_open_until",
        "_probe_fail", "_probe_slow", "_probes_done", "_probes_out", "_slow_s", "_state",
        "_trips",
        "org_code", "settings", "window",
    )

    def __init__(self, settings: BreakerSettings, *, clock: Clock, org_code: str = "",
                 emit: Emitter | None = None) -> None:
        self.settings = settings
        self.org_code = org_code
        self._clock = clock
        self._emit = emit if emit is not None else Emitter()
        self.window: CountWindow | TimeWindow
        if settings.window_type is WindowType.COUNT:
            self.window = CountWindow(settings.window_size)
            self._min_calls = min(settings.minimum_calls, settings.window_size)
        else:
            self.window = TimeWindow(settings.window_size)
            self._min_calls = settings.minimum_calls
        self._slow_s = settings.slow_call_duration
        self._state = State.CLOSED
        self._down_run = 0  # "provider down" outcomes in a row since the window was cleared
        self._trips = 0
        self._open_until = 0.0
        self._half_open_since = 0.0
        self._epoch = 0
        self._probes_out = 0
        self._probes_done = 0
        self._probe_fail = 0
        self._probe_slow = 0

    # ----------------------------------------------------------------- reading
    @property
    def state(self) -> State:
        """The current state, after any time-based transition now due."""
        s = self._state
        if s is _OPEN or s is _HALF_OPEN:  # module names: read on every slice's starts
            self._tick(self._clock.monotonic())
        return self._state

    @property
    def is_open(self) -> bool:
        """Every call refused now (OPEN or FORCED_OPEN), after any transition now due."""
        return self.state in _OPEN_STATES

    @property
    def allows_retry(self) -> bool:
        """Retries only while CLOSED (or not judging): never during probing or when open."""
        return self._state in _RETRY_STATES

    @property
    def open_until(self) -> float | None:
        return self._open_until if self._state is State.OPEN else None

    @property
    def trips(self) -> int:
        """Consecutive trips since the circuit last closed (sets the OPEN wait)."""
        return self._trips

    def rates(self, now: float | None = None) -> tuple[float, float, int]:
        """(failure rate, slow-call rate, calls) in the window; rates are 0 with no calls."""
        w = self.window
        w.expire(self._clock.monotonic() if now is None else now)
        if not w.total:
            return 0.0, 0.0, 0
        return w.failures / w.total, w.slow / w.total, w.total

    # ---------------------------------------------------------------- per call
    def try_acquire(self, now: float) -> int:
        """REFUSED, CALL, or a half-open probe permit (>= PROBE)."""
        s = self._state
        if s is _CLOSED or s is _DISABLED or s is _METRICS_ONLY:
            return CALL
        if s is State.FORCED_OPEN:
            return REFUSED
        self._tick(now)
        if self._state is not State.HALF_OPEN:
            return REFUSED
        if self._probes_out + self._probes_done >= self.settings.half_open_permits:
            return REFUSED
        self._probes_out += 1
        return PROBE + self._epoch

    def record(self, outcome: Outcome, duration: float, now: float, permit: int,
               tran_id: str | None = None) -> None:
        """Learn from one logical call's final outcome; ``duration`` is its slowest attempt."""
        kind = outcome.kind
        s = self._state
        if permit == CALL:
            if kind is _SUCCESS and s is _CLOSED and duration < self._slow_s:
                w = self.window
                if not w.failures and not w.slow:
                    # A healthy provider's every call: a quick success into a window of
                    # quick successes leaves both rates at 0, below any threshold (which
                    # is > 0), and the down run at 0: nothing to decide.
                    self._down_run = 0
                    w.add_ok(now)
                    return
            if kind in _NEUTRAL:
                return
            if s is State.CLOSED or s is State.METRICS_ONLY:
                code = FAILED if kind in _FAILURE else 0
                if duration >= self.settings.slow_call_duration:
                    code |= SLOW
                w = self.window
                w.add(code, now)
                # (is_down is a property: a call's frame saved on every success)
                self._down_run = (self._down_run + 1 if kind is _FAULT and outcome.is_down
                                  else 0)
                if s is not State.CLOSED:
                    return
                st = self.settings
                if w.total >= self._min_calls:
                    total = w.total
                    if w.failures / total >= st.failure_rate_threshold:
                        self._trip(now, "failure rate", tran_id)
                        return
                    if w.slow / total >= st.slow_call_rate_threshold:
                        self._trip(now, "slow-call rate", tran_id)
                        return
                if self._down_run >= st.consecutive_down:
                    self._trip(now, "provider down", tran_id)
            return
        if permit < PROBE:
            return
        # a half-open probe
        self._tick(now)
        if self._state is not State.HALF_OPEN or permit - PROBE != self._epoch:
            return  # a probe from an earlier half-open period: already decided
        self._probes_out -= 1
        if kind in _NEUTRAL:
            return
        self._probes_done += 1
        if kind in _FAILURE:
            self._probe_fail += 1
        if duration >= self.settings.slow_call_duration:
            self._probe_slow += 1
        st = self.settings
        n = self._probes_done
        if n >= st.half_open_permits:
            if self._probe_fail / n >= st.failure_rate_threshold:
                self._trip(now, "probes failed", tran_id)
            elif self._probe_slow / n >= st.slow_call_rate_threshold:
                self._trip(now, "probes slow", tran_id)
            else:
                self._trips = 0
                self._to(State.CLOSED, now, "probes succeeded", tran_id)

    def release(self, permit: int) -> None:
        """Give a permit back without an outcome (the call was cancelled or crashed)."""
        if permit >= PROBE and self._state is State.HALF_OPEN and permit - PROBE == self._epoch:
            self._probes_out -= 1

    # ------------------------------------------------------------------ manual
    def force_open(self) -> None:
        """Refuse every call until reset()."""
        self._to(State.FORCED_OPEN, self._clock.monotonic(), "forced open")

    def disable(self) -> None:
        """Let every call through and record nothing until reset()."""
        self._to(State.DISABLED, self._clock.monotonic(), "disabled")

    def metrics_only(self) -> None:
        """Let every call through and keep the rates, but never trip, until reset()."""
        self._clear()
        self._to(State.METRICS_ONLY, self._clock.monotonic(), "metrics only")

    def reset(self) -> None:
        """Back to CLOSED with an empty window and no trip history."""
        self._trips = 0
        self._to(State.CLOSED, self._clock.monotonic(), "reset")

    # --------------------------------------------------------------- internals
    def _tick(self, now: float) -> None:
        s = self._state
        if s is State.OPEN:
            if now >= self._open_until:
                self._epoch += 1
                self._probes_out = self._probes_done = self._probe_fail = self._probe_slow = 0
                self._half_open_since = now
                self._to(State.HALF_OPEN, now, "open wait over")
        elif s is State.HALF_OPEN and now - self._half_open_since >= \
                self.settings.half_open_max_time:
            self._trip(now, "half-open too long")

    def _trip(self, now: float, reason: str, tran_id: str | None = None) -> None:
        self._trips += 1
        self._open_until = now + self.settings.open_wait_for(self._trips)
        self._to(State.OPEN, now, reason, tran_id)

    def _to(self, new: State, now: float, reason: str, tran_id: str | None = None) -> None:
        old = self._state
        self._state = new
        if new is State.CLOSED:
            self._clear()
        if self._emit.active and old is not new:
            self._emit(StateChanged(self.org_code, str(old), str(new), now, reason, tran_id))

    def _clear(self) -> None:
        self.window.clear()
        self._down_run = 0
