"""Property: over random outcome sequences, clock steps and manual commands, the breaker's
state, window and permits always match a plain reference model of the same rules.

The model keeps every recorded call in a list and recomputes the window from scratch each
time, so it shares nothing with the ring buffers and 1-second buckets it checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from batch.clock import FakeClock
from batch.resilience.breaker import CALL, REFUSED, CircuitBreaker
from batch.resilience.outcomes import Outcome, timed_out
from batch.resilience.settings import BreakerSettings, WindowType
from tests.resilience.fakes import BAD_REQUEST, CONN, DEAD, DOWN, FAULT, OK, THROTTLED

SLOW_AFTER = 5.0
OUTCOMES = [OK, FAULT, timed_out(), THROTTLED, DEAD, BAD_REQUEST, DOWN, CONN]


@dataclass
class Model:
    """The breaker's rules, written the obvious way."""

    s: BreakerSettings
    state: str = "closed"
    # (second, fail, slow, down): every call recorded since the circuit last closed
    records: list[tuple[int, bool, bool, bool]] = field(default_factory=list)
    trips: int = 0
    open_until: float = 0.0
    half_open_since: float = 0.0
    period: int = 0
    probes_out: int = 0
    probes: list[tuple[bool, bool]] = field(default_factory=list)

    def window(self, now: float) -> list[tuple[int, bool, bool, bool]]:
        if self.s.window_type is WindowType.COUNT:
            return self.records[-self.s.window_size:]
        return [r for r in self.records if r[0] > int(now) - self.s.window_size]

    def move(self, new: str) -> None:
        self.state = new
        if new == "closed":
            self.records = []

    def trip(self, now: float) -> None:
        self.trips += 1
        wait = min(self.s.open_wait * self.s.open_wait_multiplier ** (self.trips - 1),
                   self.s.open_wait_max)
        self.open_until = now + wait
        self.move("open")

    def tick(self, now: float) -> None:
        if self.state == "open" and now >= self.open_until:
            self.period += 1
            self.probes_out, self.probes = 0, []
            self.half_open_since = now
            self.move("half_open")
        elif self.state == "half_open" and now - self.half_open_since >= \
                self.s.half_open_max_time:
            self.trip(now)

    def acquire(self, now: float) -> tuple[str, int] | None:
        self.tick(now)
        if self.state in ("closed", "disabled", "metrics_only"):
            return ("call", 0)
        if self.state == "half_open" and self.probes_out + len(self.probes) < \
                self.s.half_open_permits:
            self.probes_out += 1
            return ("probe", self.period)
        return None

    def record(self, permit: tuple[str, int], o: Outcome, duration: float, now: float) -> None:
        neutral = o.kind in ("rejected", "consent", "client", "throttled")
        failed = o.kind in ("fault", "timeout")
        slow = duration >= self.s.slow_call_duration
        if permit[0] == "call":
            if neutral or self.state not in ("closed", "metrics_only"):
                return
            # down: 50005, or a fault with no HTTP answer at all (connection refused)
            down = o.kind == "fault" and (o.rsp_code == "50005" or o.http_status is None)
            self.records.append((int(now), failed, slow, down))
            w = self.window(now)
            down_run = 0
            for r in reversed(self.records):
                if not r[3]:
                    break
                down_run += 1
            minimum = (min(self.s.minimum_calls, self.s.window_size)
                       if self.s.window_type is WindowType.COUNT else self.s.minimum_calls)
            if self.state != "closed":
                return
            if len(w) >= minimum:
                fails = sum(1 for r in w if r[1]) / len(w)
                slows = sum(1 for r in w if r[2]) / len(w)
                if fails >= self.s.failure_rate_threshold or \
                        slows >= self.s.slow_call_rate_threshold:
                    self.trip(now)
                    return
            if down_run >= self.s.consecutive_down:
                self.trip(now)
            return
        self.tick(now)
        if self.state != "half_open" or permit[1] != self.period:
            return
        self.probes_out -= 1
        if neutral:
            return
        self.probes.append((failed, slow))
        n = len(self.probes)
        if n >= self.s.half_open_permits:
            if sum(1 for p in self.probes if p[0]) / n >= self.s.failure_rate_threshold or \
                    sum(1 for p in self.probes if p[1]) / n >= self.s.slow_call_rate_threshold:
                self.trip(now)
            else:
                self.trips = 0
                self.move("closed")

    def manual(self, command: str) -> None:
        if command == "force_open":
            self.move("forced_open")
        elif command == "disable":
            self.move("disabled")
        elif command == "metrics_only":
            self.records = []
            self.move("metrics_only")
        else:
            self.trips = 0
            self.move("closed")


breaker_settings = st.builds(
    BreakerSettings,
    window_type=st.sampled_from(list(WindowType)),
    window_size=st.integers(1, 8),
    minimum_calls=st.integers(1, 6),
    consecutive_down=st.integers(1, 4),
    failure_rate_threshold=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    slow_call_rate_threshold=st.sampled_from([0.5, 1.0]),
    slow_call_duration=st.just(SLOW_AFTER),
    open_wait=st.sampled_from([1.0, 5.0]),
    open_wait_multiplier=st.sampled_from([1.0, 2.0]),
    open_wait_max=st.just(12.0),
    half_open_permits=st.integers(1, 3),
    half_open_max_time=st.sampled_from([3.0, 50.0]),
)

advance = st.tuples(st.just("advance"), st.sampled_from([0.0, 0.3, 0.5, 1.0, 2.7, 5.0, 13.0]))
acquire = st.tuples(st.just("acquire"), st.just(0))
finish = st.tuples(st.just("finish"), st.integers(0, 50), st.sampled_from(range(len(OUTCOMES))),
                   st.sampled_from([0.1, SLOW_AFTER, 9.0]))
# mostly successes and faults, so the breaker trips, probes and closes again and again
call = st.tuples(st.just("call"), st.sampled_from([0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 6, 7]),
                 st.sampled_from([0.1, 0.1, 0.1, SLOW_AFTER]))
manual = st.tuples(st.just("manual"),
                   st.sampled_from(["force_open", "disable", "metrics_only", "reset"]))
# one_of picks a branch uniformly: repeating a branch weights it
ops = st.lists(st.one_of(call, call, call, call, call, call, advance, advance, advance, acquire,
                         acquire, finish, finish, manual), min_size=20, max_size=100)


@settings(max_examples=300, deadline=None)
@given(breaker_settings, ops, st.integers(0, 3))
def test_breaker_matches_the_reference_model(s: BreakerSettings, steps: list[tuple[object, ...]],
                                            manual_every: int) -> None:
    clock = FakeClock()
    b = CircuitBreaker(s, clock=clock)
    m = Model(s)
    pending: list[tuple[int, tuple[str, int]]] = []
    for step in steps:
        op = step[0]
        now = clock.monotonic()
        if op == "advance":
            clock.advance(step[1])  # type: ignore[arg-type]
        elif op in ("acquire", "call"):
            permit = b.try_acquire(now)
            expected = m.acquire(now)
            assert (permit != REFUSED) == (expected is not None)
            if expected is not None:
                assert (permit == CALL) == (expected[0] == "call")
                if op == "call":
                    o = OUTCOMES[step[1]]  # type: ignore[index]
                    b.record(o, step[2], now, permit)  # type: ignore[arg-type]
                    m.record(expected, o, step[2], now)  # type: ignore[arg-type]
                else:
                    pending.append((permit, expected))
        elif op == "finish" and pending:
            permit, expected = pending.pop(step[1] % len(pending))  # type: ignore[operator]
            o = OUTCOMES[step[2]]  # type: ignore[index]
            b.record(o, step[3], now, permit)  # type: ignore[arg-type]
            m.record(expected, o, step[3], now)  # type: ignore[arg-type]
        elif op == "manual" and manual_every == 0:  # manual commands in a quarter of runs
            getattr(b, step[1])()  # type: ignore[call-overload]
            m.manual(step[1])  # type: ignore[arg-type]
        now = clock.monotonic()
        m.tick(now)
        assert str(b.state) == m.state
        assert b.trips == m.trips
        w = m.window(now)
        fails, slows, calls = b.rates(now)
        assert calls == len(w)
        assert fails == (sum(1 for r in w if r[1]) / len(w) if w else 0.0)
        assert slows == (sum(1 for r in w if r[2]) / len(w) if w else 0.0)
