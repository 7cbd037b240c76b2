"""One provider's chain: CircuitBreaker(Retry(RateLimiter(Bulkhead(timeout(attempt))))).

``ProviderChain.call`` runs one logical call: the breaker admits it (or it is refused and
touches nothing inside), then each attempt takes a limiter slot, a bulkhead permit and a
timeout, and transient faults are retried within the retry budget and the call's deadline.
The breaker learns one outcome per logical call, so retries never make it open sooner.

The layers are plain objects with synchronous decisions; this coroutine is the only place
that awaits, so a call that needs no waiting creates no task and no future.
"""

from __future__ import annotations

import random as _random
from asyncio import CancelledError as _CancelledError
from collections.abc import Awaitable, Callable, Sequence

from batch.clock import Clock
from batch.resilience.breaker import CALL, CircuitBreaker
from batch.resilience.bulkhead import Bulkhead
from batch.resilience.events import (
    Emitter,
    Listener,
    Rejected,
    RetryScheduled,
    RetrySkipped,
)
from batch.resilience.limiter import NO_PERMIT, RateLimiter
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected, timed_out
from batch.resilience.retry import Backoff, RetryBudget
from batch.resilience.settings import ChainSettings

Attempt = Callable[[float], Awaitable[Outcome]]

_FAULT = Kind.FAULT
_THROTTLED = Kind.THROTTLED
_REJECTED = Kind.REJECTED

#: cluster mode: how long a call waits for the next shared permits when the worker's stock
#: is empty (a refill runs every slice; a late one must not turn into a refused call)
PERMIT_WAIT = 1.0


class ProviderChain:
    """The resilience chain shared by every call to one provider in this process."""

    __slots__ = (
        "_backoff", "_breaker", "_budget", "_bulkhead", "_bulkhead_wait", "_call_deadline",
        "_clock", "_emit", "_limiter", "_max_attempts", "_min_attempt_time", "_per_attempt",
        "_rej_breaker", "_rej_bulkhead", "_rej_deadline", "_rej_limiter", "org_code",
        "settings",
    )

    def __init__(self, org_code: str, settings: ChainSettings, *, clock: Clock,
                 listeners: Sequence[Listener] = (),
                 random: Callable[[], float] | None = None) -> None:
        self.org_code = org_code
        self.settings = settings
        self._clock = clock
        self._emit = Emitter(listeners, org_code=org_code)
        self._breaker = CircuitBreaker(settings.breaker, clock=clock, org_code=org_code,
                                       emit=self._emit)
        self._limiter = RateLimiter(settings.limiter, org_code=org_code, emit=self._emit)
        self._bulkhead = Bulkhead(settings.bulkhead.max_concurrent)
        self._bulkhead_wait = settings.bulkhead.max_wait
        self._budget = RetryBudget(settings.retry)
        self._backoff = Backoff(settings.retry, random if random is not None
                                else _random.random)
        self._max_attempts = settings.retry.max_attempts
        self._min_attempt_time = settings.retry.min_attempt_time
        self._per_attempt = settings.timeouts.per_attempt
        self._call_deadline = settings.timeouts.call_deadline
        # Outcomes are frozen: one instance per kind of refusal serves every call.
        self._rej_breaker = rejected(Layer.BREAKER, "circuit open")
        self._rej_limiter = rejected(Layer.LIMITER, "rate limit wait too long")
        self._rej_bulkhead = rejected(Layer.BULKHEAD, "too many calls in flight")
        self._rej_deadline = rejected(Layer.DEADLINE, "deadline passed")

    @property
    def breaker(self) -> CircuitBreaker:
        return self._breaker

    @property
    def limiter(self) -> RateLimiter:
        return self._limiter

    @property
    def bulkhead(self) -> Bulkhead:
        return self._bulkhead

    @property
    def budget(self) -> RetryBudget:
        return self._budget

    async def _await_permit(self, now: float, deadline: float) -> float:
        """Cluster mode, no shared permit in stock: wait for the next refills (strict: a
        real permit or nothing) up to PERMIT_WAIT; the slot's wait, or -1.0 (refused)."""
        limiter = self._limiter
        clock = self._clock
        until = min(deadline, now + PERMIT_WAIT)
        while True:
            shared = limiter.shared
            left = until - now
            if shared is None:  # the shared limit was dropped meanwhile: the local one
                return limiter.reserve(now, limiter.max_wait if limiter.max_wait < left
                                       else left) if left > 0.0 else -1.0
            if left <= 0.0 or not await shared.refilled(clock, left):
                return -1.0
            now = clock.monotonic()
            wait = limiter.reserve(now, limiter.max_wait if limiter.max_wait < until - now
                                   else until - now)
            if wait != NO_PERMIT:
                return wait

    async def call(self, attempt: Attempt, *, deadline: float | None = None) -> Outcome:
        """Run one logical call; returns its final outcome (``.attempts`` = attempts made).

        ``attempt(timeout_s)`` performs one HTTP attempt and returns its classified outcome.
        ``deadline`` is an absolute ``clock.monotonic()`` time for all attempts together.
        Listeners get exactly one CallFinished per call (or its fields, through their call
        sink: :class:`~batch.resilience.events.Listener`), plus a Rejected when one of our
        layers refused it (or refused a retry).
        """
        clock = self._clock
        now = clock.monotonic()
        started = now
        if deadline is None:
            deadline = now + self._call_deadline
        breaker = self._breaker
        permit = breaker.try_acquire(now)
        if not permit:
            if self._emit.active:
                self._emit(Rejected(self.org_code, Layer.BREAKER, "circuit open"))
            if self._emit.ends:
                self._emit.ended(self.org_code, None, self._rej_breaker, 0, 0.0)
            return self._rej_breaker
        self._budget.note_call(now)
        limiter = self._limiter
        bulkhead = self._bulkhead
        attempts = 0
        slowest = 0.0
        out: Outcome | None = None
        refused: Outcome | None = None
        late = False
        held = False  # a bulkhead permit kept while a missed slot is taken again
        try:
            while True:
                # -- rate limiter: a slot, or refused if it is too far off
                left = deadline - now
                if left <= 0.0:
                    refused = self._rej_deadline
                    break
                wait = limiter.reserve(now, limiter.max_wait if limiter.max_wait < left
                                       else left)
                if wait == NO_PERMIT:
                    wait = await self._await_permit(now, deadline)
                    now = clock.monotonic()
                slot_at = now
                if wait:
                    if wait < 0.0:
                        refused = self._rej_limiter
                        break
                    slot_at = now + wait
                    await clock.sleep_until(slot_at)
                    now = clock.monotonic()
                # -- bulkhead: a permit, or refused after its maximum wait
                if held:
                    held = False  # kept from the missed slot
                elif not bulkhead.try_acquire():
                    left = deadline - now
                    if not await bulkhead.acquire(
                            clock, self._bulkhead_wait if self._bulkhead_wait < left else left):
                        refused = self._rej_bulkhead
                        break
                    now = clock.monotonic()
                if now != slot_at and not late and limiter.late(slot_at, now):
                    # A stall, or the wait for the bulkhead, made this call miss its slot:
                    # it takes the next one (once: a worker that is always late would
                    # otherwise spend every slot missing it), keeping its permit: handed on,
                    # the permit went round the queue of waiters, each as late, while none
                    # of them called (tests/resilience/test_chain.py pins the order).
                    late = True
                    held = True
                    continue
                # -- timeout(attempt)
                try:
                    t = deadline - now
                    if t <= 0.0:
                        refused = self._rej_deadline
                        break
                    if self._per_attempt < t:
                        t = self._per_attempt
                    # the timeout's block without ``async with`` (two coroutines an attempt)
                    d = clock.deadline(t)
                    try:
                        try:
                            o = await attempt(t)
                        finally:
                            ours = d.leave()  # True: its expiry cancelled this task
                    except (_CancelledError, TimeoutError) as exc:
                        if isinstance(exc, _CancelledError) and not ours:
                            raise  # a cancellation from elsewhere
                        o = timed_out(f"no answer within {t:.3g} s",
                                      elapsed=clock.monotonic() - now)
                finally:
                    bulkhead.release()
                end = clock.monotonic()
                if o.kind is _REJECTED:  # the attempt itself declined (e.g. shutting down)
                    refused = o
                    now = end
                    break
                out = o
                attempts += 1
                if end - now > slowest:
                    slowest = end - now
                now = end
                kind = o.kind
                if kind is not _FAULT or not o.retryable:
                    if kind is _THROTTLED:
                        limiter.observe(o, now)
                    break
                # -- retry: a transient fault
                if not await self._retry_wait(o, attempts, permit, now, deadline):
                    break
                now = clock.monotonic()
        except BaseException:
            if held:
                bulkhead.release()
            breaker.release(permit)
            raise
        if held:  # refused (deadline, limiter) while taking the next slot
            bulkhead.release()
        if refused is not None:
            if self._emit.active:
                self._emit(Rejected(self.org_code, refused.layer or Layer.DEADLINE,
                                    refused.detail, out.tran_id if out else None))
            if out is None:
                breaker.record(refused, 0.0, now, permit)  # neutral: frees a probe permit
                if self._emit.ends:
                    self._emit.ended(self.org_code, None, refused, 0, now - started)
                return refused
        assert out is not None
        if out.attempts != attempts:
            out = out.with_(attempts=attempts)
        breaker.record(out, slowest, now, permit, out.tran_id)
        emit = self._emit
        sink = emit.sink
        if sink is not None:  # the recorder alone: called here, no event, no frame between
            try:
                sink(out.tran_id, out, attempts, now - started)
            except Exception:
                emit.sink_failed(sink)
        elif emit.ends:
            emit.ended(self.org_code, out.tran_id, out, attempts, now - started, slowest)
        return out

    async def _retry_wait(self, out: Outcome, attempts: int, permit: int, now: float,
                          deadline: float) -> bool:
        """Decide whether to retry after a transient fault and wait the backoff if so."""
        reason = ""
        delay = 0.0
        if attempts >= self._max_attempts:
            reason = "attempts exhausted"
        elif permit != CALL or not self._breaker.allows_retry:
            reason = "breaker not closed"
        else:
            delay = self._backoff.wait(attempts)
            left = deadline - now - delay
            if left <= 0.0 or left < self._min_attempt_time:
                reason = "deadline"
            elif not self._budget.try_spend(now):
                reason = "retry budget exhausted"
        if reason:
            if self._emit.active:
                self._emit(RetrySkipped(self.org_code, out.tran_id, attempts, reason))
            return False
        if self._emit.active:
            self._emit(RetryScheduled(self.org_code, out.tran_id, attempts, delay, out.kind,
                                      out.rsp_code, out.elapsed))
        if delay > 0.0:
            await self._clock.sleep_until(now + delay)
        return True

    def snapshot(self) -> dict[str, object]:
        """A JSON-able picture of the chain now, for the dashboard and the run summary."""
        now = self._clock.monotonic()
        b = self._breaker
        state = b.state
        failure_rate, slow_rate, calls = b.rates(now)
        budget_calls, budget_retries = self._budget.counts(now)
        limiter = self._limiter
        return {
            "org_code": self.org_code,
            "breaker": {
                "state": str(state),
                "failure_rate": round(failure_rate, 4),
                "slow_call_rate": round(slow_rate, 4),
                "calls_in_window": calls,
                "trips": b.trips,
                "open_for_s": (round(max(0.0, b.open_until - now), 3)
                               if b.open_until is not None else None),
            },
            "limiter": {
                "rate": round(limiter.rate(now), 4),
                "base_rate": limiter.base_rate,
                "next_wait_s": round(limiter.next_wait(now), 6),
                "paused_for_s": (round(max(0.0, limiter.paused_until - now), 3)
                                 if limiter.paused_until is not None else 0.0),
            },
            "bulkhead": {
                "in_use": self._bulkhead.in_use,
                "waiting": self._bulkhead.waiting,
                "max_concurrent": self._bulkhead.limit,
            },
            "retry_budget": {
                "available": self._budget.available(now),
                "calls_in_window": budget_calls,
                "retries_in_window": budget_retries,
            },
        }
