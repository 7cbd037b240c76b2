"""One provider's day: a producer claiming from the database every second, a consumer
starting each 100 ms slice's refreshes as detached tasks, at the planned rate.

The producer fetches just ahead of the consumer (a couple of seconds of work, never a whole
minute) into a queue kept at that size, and only while a minute with work is on (an idle
provider costs no query). Ahead of the starts, in the background, the
consumer keeps about the coming second of the queue's head marked started (one statement
per half second or so), and starts only marked claims: after a crash, a claim that may have
been called is never taken for an uncalled one, and a claim that only sat in the queue is
plainly due again, not an unknown outcome. The consumer ticks on absolute deadlines, so a late
tick never shifts the ones after it; lateness is measured per tick. A slice with nothing to
start is not ticked (a slow provider wakes only for its starts), and each provider's ticks
sit at their own offset into the slice (so hundreds of providers do not all wake at once).
A slow refresh never delays a tick: each runs in its own task.

Each provider also has a phase in [0, 1) (the run gives the i-th of N providers i/N): its
starts fall in the slices that far along the carried fraction (``slice_counts``; the minute's
count is the same), so N providers' starts are spread over the slices instead of all landing
in the same ones (at 2 refreshes/s, every provider started in one slice of five, and every
tick due there waited behind all their refreshes). Measured on PostgreSQL with
tests/bench/test_many_providers.py, one after the other at load 1.2-2.0: 300 providers, the
worst provider's lateness p50 79 -> 9.4 ms, p99 297 -> 45 ms, 7,458 -> 36 missed slices of
72,000, 71 -> 69 % of a core; 100 providers (MANY_BENCH_PROVIDERS=100, load 0.9-2.5) p50
31-39 -> 2.4-3.4 ms, p99 98-122 -> 12-36 ms, 73-237 -> 0 missed. On a machine shared at
load 3.5 and more, with or without the phase, 300 providers do not keep up. The producers
keep their common cadence on purpose: the store gathers claims asked in the same turn into
one statement, and phasing the producers too (i/N of the second) was measured to cost 10
points of a core and ~50 statements/s more for no better p50.

Each consumer keeps its own timer rather than one ticker for all providers: a shared ticker
wakes every provider due in a slice at the slice's start, one after the other, and
tests/bench/test_shared_ticker.py measured it (300 providers x 2 starts/s, three rounds
alternated, medians) at 0.81x the CPU of the ticks but 2.3x their lateness p50 and 1.2x
their p99; the CPU it saves is the loop's wake-ups, which a busy run pays anyway for its I/O.
"""

from __future__ import annotations

import asyncio
import logging
import math
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from itertools import islice
from typing import Protocol

from batch.aio import cancel_and_wait
from batch.client import RefreshResult
from batch.clock import KST, Clock
from batch.db import work
from batch.dispatch.pacing import SLICE_SECONDS, SLICES_PER_MINUTE, minute_target, slice_counts
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.stats import MinuteRecord, ProviderStats
from batch.dispatch.writer import OutcomeWriter
from batch.errors import describe
from batch.lifecycle import DeadLetter, NotAttempted, admit, decide, unsaved_tokens
from batch.resilience.outcomes import Kind, Outcome
from planning.minutes import FINISH_MARGIN_SECONDS

log = logging.getLogger("mydata.dispatch")

#: how far ahead of the starts the queue's head is kept marked started
MARK_AHEAD_SECONDS = 1.0

#: the longest a consumer sleeps without looking at the stop event
STOP_CHECK_SECONDS = 1.0
#: slices between two looks at the cluster's day in its last minute (``_topup``)
TOPUP_SLICES = 10

#: refresh(claim, not_after): not_after is the monotonic time no call may start after
RefreshFn = Callable[[work.Claim, float | None], Awaitable[RefreshResult]]


class StartAllowance(Protocol):
    """Cluster mode (batch/cluster/allowance.py): a provider-minute's starts are shared by
    the cluster's workers. Without one, every start the plan asks for is granted."""

    async def take(self, minute: int, due: int, fresh: int, queued: int) -> int: ...

    def refund(self, n: int) -> None: ...

    async def left(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """How the dispatcher paces and leases; the defaults suit production."""

    worker_id: str
    lease: timedelta = timedelta(minutes=10)
    lookahead_seconds: float = 2.0
    claim_interval: float = 1.0
    max_claim: int = 5000
    #: the fewest claims fetched at once (fewer queries for slow providers)
    min_claim: int = 10
    idle_recheck: float = 5.0
    #: no refresh starts in a window's last seconds, so its calls end inside the window
    #: (the planner gives that minute only what fits before it: planning.minutes)
    finish_margin: float = FINISH_MARGIN_SECONDS

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must not be empty")
        if self.lease <= timedelta(seconds=1):
            raise ValueError("lease must be longer than a second")
        if self.min_claim < 1 or self.max_claim < self.min_claim:
            raise ValueError("need 1 <= min_claim <= max_claim")
        if self.lookahead_seconds <= 0 or self.claim_interval <= 0:
            raise ValueError("lookahead_seconds and claim_interval must be positive")
        if not 0 <= self.finish_margin <= 30:
            raise ValueError("finish_margin must be between 0 and 30 seconds")


class ProviderDispatcher:
    """Runs one provider's minutes for one day."""

    def __init__(
        self,
        org_code: str,
        *,
        store: work.WorkStore,
        refresh: RefreshFn,
        writer: OutcomeWriter,
        clock: Clock,
        settings: DispatchSettings,
        policy: RetryPolicy,
        day: date,
        week: date,
        quota: int,
        minutes: Mapping[int, int],
        per_minute_cap: int,
        window_minutes: Sequence[int] | None = None,
        attempted_before: int = 0,
        breaker_open: Callable[[], bool] = lambda: False,
        breaker_state: Callable[[], str] = lambda: "closed",
        allowance: StartAllowance | None = None,
        max_in_flight: Callable[[], int] | None = None,
        phase: float = 0.0,
        offset: float | None = None,
    ) -> None:
        self.org_code = org_code
        self._store = store
        self._refresh = refresh
        self._writer = writer
        self._clock = clock
        self._settings = settings
        self._policy = policy
        self._day = day
        self._week = week
        self._planned = dict(minutes)
        self._minutes = sorted(m for m in self._planned if self._planned[m] > 0)
        self._open = set(window_minutes) if window_minutes is not None else set(self._planned)
        self._open.update(self._minutes)
        self._cap = max(1, per_minute_cap)
        self._breaker_open = breaker_open
        self._allowance = allowance
        #: refreshes under way at most (the provider's concurrency): more would only queue
        #: at the bulkhead and the HTTP pool, or be refused, each a claim and an outcome
        #: written for nothing; the starts wait for room instead (``_room_by``)
        self._max_in_flight = max_in_flight
        #: set while the slice's starts wait for room: resolved by a refresh's end that
        #: takes the refreshes under way down to ``_room_at``
        self._room: asyncio.Future[None] | None = None
        self._room_at = 0
        self.stats = ProviderStats(org_code, day_quota=quota, attempted_before=attempted_before,
                                   state_of=breaker_state)
        self._queue: deque[work.Claim] = deque()
        self._marked = 0  # the queue's first claims already marked started
        self._marking: asyncio.Task[None] | None = None  # the start mark in flight
        #: refreshes under way by start number; each takes itself out as it ends (no done
        #: callback: that was one more handle through the loop a refresh)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._started = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # set by run()
        self._held: set[int] = set()  # claims queued or in flight: ours, lease renewed
        self._retaken: set[int] = set()  # claimed again while held: give back once written
        self._rate = 0.0  # refreshes per second in the current minute, for the producer
        self._claiming = True
        #: the last claim found fewer than it asked for: what is queued is all there is
        #: until the producer looks again (the last minute's top-up counts on no more)
        self._dry = False
        self._nudge = asyncio.Event()  # wakes the producer when the rate changes
        # Each provider's slices start at its own offset into the slice (``offset``, a
        # fraction of it; the run gives the i-th provider frac(i * golden ratio), else a
        # hash of the org code), so hundreds of providers in one process do not all wake at
        # once. Spread over the whole slice, not its first half: the starts' work queued up
        # behind each other in that half (300 providers: the worst one's median lateness
        # 8.9 -> 4.1 ms, every tick's 3.8 -> 1.2 ms; tests/bench/test_many_providers.py).
        if offset is None:
            offset = zlib.crc32(org_code.encode()) % 1000 / 1000
        if not 0.0 <= offset < 1.0:
            raise ValueError("offset must be in [0, 1)")
        self._offset = offset * SLICE_SECONDS
        #: where along the carried fraction this provider's starts fall, in [0, 1) (see
        #: slice_counts and the module's docstring); the run gives provider i of N i/N
        if not 0.0 <= phase < 1.0:
            raise ValueError("phase must be in [0, 1)")
        self._period_phase = phase
        writer.watch(org_code, self._held.discard)

    # -- quota bookkeeping -------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Claims held in the queue, waiting to be started."""
        return len(self._queue)

    @property
    def remaining(self) -> int:
        """Refreshes still to start today (planned minus attempted, started and in flight)."""
        return max(0, self.stats.day_quota - self.stats.attempted_before - self.stats.started)

    def _to_claim(self) -> int:
        return max(0, self.remaining - len(self._queue))

    # -- producer ----------------------------------------------------------------------

    async def _produce(self, stop: asyncio.Event) -> None:
        cursor: work.Cursor = work.START
        nxt = self._clock.monotonic()
        idle_until = 0.0
        renew_at = nxt + self._settings.lease.total_seconds() / 3
        while not stop.is_set() and self._claiming:
            now_m = self._clock.monotonic()
            want = self._want()
            if want > 0 and now_m >= idle_until and self._writer.healthy:
                try:
                    got = await self._claim(cursor, want)
                    if len(got) < want and cursor != work.START:
                        # End of the keyset range: wrap once to pick up consents that came
                        # due again since (retries past their not_before, expired leases).
                        cursor = work.START
                        got += await self._claim(cursor, want - len(got))
                    self._dry = len(got) < want
                    if self._dry:
                        idle_until = now_m + self._settings.idle_recheck
                    now = self._clock.now()  # the chunk's time (one, not one a claim)
                    for c in got:
                        cursor = c.cursor
                        if c.id in self._held:
                            # Still ours (a lease renewal raced the scan), or our writer
                            # freed it a moment ago and has not heard back yet: given
                            # back below once its outcome is known to be written.
                            self._retaken.add(c.id)
                            continue
                        given_up = admit(c, week=self._week, now=now)
                        if given_up is not None:
                            self._writer.add(given_up)
                            self.stats.dead_lettered += 1
                            continue
                        self._held.add(c.id)
                        self._queue.append(c)
                except Exception as exc:  # the database may come back; keep the day going
                    self.stats.claim_errors += 1
                    log.warning("claim failed", extra={
                        "action": "claim_failed", "org_code": self.org_code,
                        "error": describe(exc)})
            if self._retaken:
                await self._give_back_retaken()
            if self._clock.monotonic() >= renew_at:
                renew_at = self._clock.monotonic() + self._settings.lease.total_seconds() / 3
                await self._renew()
            nxt = max(nxt + self._settings.claim_interval, self._clock.monotonic())
            try:
                async with self._clock.timeout(nxt - self._clock.monotonic()):
                    await self._nudge.wait()
                nxt = self._clock.monotonic()
            except TimeoutError:
                pass
            self._nudge.clear()

    def _want(self) -> int:
        """How many to claim now: nothing outside a minute with work (an idle provider
        costs no query); else, once the queue holds less than ``lookahead_seconds`` of
        work, refill it to that but at least ``min_claim``, so a slow provider claims
        every few seconds, not every second."""
        if self._rate <= 0:
            return 0
        s = self._settings
        low = math.ceil(self._rate * s.lookahead_seconds) + 1
        if len(self._queue) >= low:
            return 0
        return min(max(low, s.min_claim) - len(self._queue), self._to_claim(), s.max_claim)

    async def _give_back_retaken(self) -> None:
        """Release what a claim took again while it was still ours, once it is not: its
        outcome is written (the lease-guarded release does nothing if that outcome already
        let it go), or it would stay leased to nobody until the lease ran out."""
        done = sorted(i for i in self._retaken if i not in self._held)
        if not done:
            return
        try:
            await self._store.release(done, worker=self._settings.worker_id)
        except Exception as exc:  # its lease runs out instead
            log.warning("could not give back a claim taken twice", extra={
                "action": "release_failed", "org_code": self.org_code,
                "error": describe(exc)})
        self._retaken.difference_update(done)

    async def _renew(self) -> None:
        """Heartbeat: keep the leases of everything we hold, so no one else takes it."""
        if not self._held:
            return
        try:
            await self._store.extend(sorted(self._held), worker=self._settings.worker_id,
                                     until=self._clock.now() + self._settings.lease)
        except Exception as exc:
            log.warning("lease renewal failed", extra={
                "action": "renew_failed", "org_code": self.org_code,
                "error": type(exc).__name__})

    async def _claim(self, cursor: work.Cursor, n: int) -> list[work.Claim]:
        if n <= 0:
            return []
        return await self._store.claim(
            self.org_code, worker=self._settings.worker_id, week=self._week,
            now=self._clock.now(), limit=n, after=cursor, lease=self._settings.lease,
        )

    # -- consumer ----------------------------------------------------------------------

    def _minute_start(self, minute: int) -> datetime:
        return datetime.combine(self._day, time(0, 0), KST) + timedelta(minutes=minute)

    async def _consume(self, stop: asyncio.Event) -> None:
        for i, minute in enumerate(self._minutes):
            if stop.is_set():
                return
            offset = (self._minute_start(minute) - self._clock.now()).total_seconds()
            if offset <= -60:
                continue  # already past
            if self.remaining <= 0:
                # Everything planned is started; outcomes that come back "not attempted"
                # (our own refusals) reopen the quota, so wait for in-flight work first.
                await self._drain(None)
                if self.remaining <= 0:
                    return
            t0 = self._clock.monotonic() + offset
            # Claim nothing long before the minute: leases would age in the queue.
            if await self._wait_or_stop(t0 - self._settings.lookahead_seconds, stop):
                return
            k0 = 0 if offset >= 0 else min(SLICES_PER_MINUTE, math.ceil(-offset / SLICE_SECONDS))
            left = self.remaining
            if self._allowance is not None:  # cluster mode: what the cluster has left
                shared = await self._allowance.left()
                if shared is not None:
                    left = min(left, shared)
            n_full = minute_target(minute, self._minutes[i:], self._planned, left, self._cap)
            # Joined mid-minute: that part of its count, the rest re-spread over the later
            # minutes; the day's last minute has no later one, so it takes all that is left.
            last = i == len(self._minutes) - 1
            n = n_full if last else n_full * (SLICES_PER_MINUTE - k0) // SLICES_PER_MINUTE
            self.stats.minute_planned, self.stats.minute_started = n, 0
            # Cluster mode, the day's last minute: starts a dead worker leaves come back to
            # the day's quota mid-minute; nobody would start them after the minute's count.
            topup = last and self._allowance is not None
            if n == 0 and not topup:
                continue
            # The window segment this minute belongs to ends at ``end``; nothing starts in
            # its last finish_margin seconds, and no call at all after it.
            end = minute + 1
            while end in self._open and end < 1440:
                end += 1
            not_after = t0 + (end - minute) * 60.0
            k_end = SLICES_PER_MINUTE
            if end == minute + 1:
                k_end -= math.ceil(self._settings.finish_margin / SLICE_SECONDS - 1e-9)
            usable = max(1, k_end - k0)
            self._rate = n / (usable * SLICE_SECONDS)
            self._nudge.set()
            counts = slice_counts(n, usable, self._period_phase)
            self._mark_soon()
            owed = due = 0
            started = 0
            for k in range(len(counts)):
                check = topup and k > 0 and k % TOPUP_SLICES == 0
                if not counts[k] and not owed and not check:
                    continue  # nothing to start in this slice: no wake-up at all
                deadline = t0 + self._offset + (k0 + k) * SLICE_SECONDS
                while (deadline - self._clock.monotonic() > STOP_CHECK_SECONDS
                       and not stop.is_set()):
                    # a long gap (a slow provider): still see a stop within a second
                    await self._clock.sleep(STOP_CHECK_SECONDS)
                if stop.is_set():
                    break
                await self._clock.sleep_until(deadline)
                self.stats.tick(self._clock.monotonic() - deadline)
                if stop.is_set():
                    break
                if check:
                    extra = await self._topup(n - due, counts, k)
                    if extra:
                        n += extra
                        self.stats.minute_planned = n
                        self._rate = max(self._rate, sum(counts[k:]) / (
                            (len(counts) - k) * SLICE_SECONDS))
                        self._nudge.set()
                cnt = counts[k]
                if self._allowance is None:
                    owed += cnt
                else:  # cluster mode: the minute's count is shared among the workers
                    due += cnt
                    owed += await self._allowance.take(minute, due, cnt,
                                                       len(self._queue) - owed)
                self._mark_soon(owed)
                if not owed:
                    continue
                if self._breaker_open():
                    # Calls would be refused at once: leave them due, re-spread later.
                    self.stats.skipped_breaker_open += owed
                    self._give_back(owed)
                    owed = 0
                    continue
                busy = False
                while owed and self._queue:
                    if (self._max_in_flight is not None
                            and self.stats.in_flight >= (cap := self._max_in_flight())):
                        # The provider is busy: the starts wait for refreshes to end, up to
                        # the next slice, then go on with the rest owed. Waiting for the next
                        # slice instead made a provider start at most ``cap`` a slice however
                        # fast its refreshes ended, so a high rate needed a concurrency far
                        # above what the provider and the HTTP pool serve well.
                        if not busy:
                            busy = True
                            self.stats.busy_slices += 1
                        if not await self._room_by(cap, deadline + SLICE_SECONDS) \
                                or stop.is_set():
                            break
                        continue
                    if not self._marked and not await self._marked_now(owed):
                        break
                    self._marked -= 1
                    self._start(self._queue.popleft(), not_after)
                    owed -= 1
                    started += 1
                self.stats.minute_started = started
            # Granted and not started (the queue ran dry, a stop): the cluster's day gets
            # them back, or the workers together would run out of quota with work left.
            self._give_back(owed)
            log.debug("minute done", extra={
                "action": "minute_done", "org_code": self.org_code, "minute": minute,
                "target": n, "started": started, "given_back": owed,
                "queued": len(self._queue), "remaining": self.remaining})
            self.stats.minutes.append(MinuteRecord(minute, n, started))
            self._rate = 0.0
        # Let the last starts finish before the day is called done.

    async def _topup(self, ahead: int, counts: list[int], k: int) -> int:
        """The day's last minute in cluster mode: what the cluster's day has left beyond
        the ``ahead`` starts this minute still grants (a dead worker's unused starts, taken
        back) is spread over the minute's slices from ``k`` on (``counts`` grows in place);
        returns how many were added."""
        assert self._allowance is not None
        shared = await self._allowance.left()
        if shared is None:
            return 0
        can = min(shared, self.remaining)
        if self._dry:
            # Nothing more to claim (all revoked, or held by the other workers): only the
            # queue can start. Topped up past it, the minute's count grew by what the
            # cluster's day had left at every look (960 planned, 1,382 logged) and its
            # grants sat unused until the minute ended.
            can = min(can, len(self._queue))
        extra = can - ahead
        if extra <= 0:
            return 0
        for j, c in enumerate(slice_counts(extra, len(counts) - k, self._period_phase)):
            counts[k + j] += c
        return extra

    async def _room_by(self, cap: int, until: float) -> bool:
        """Wait until a quarter of the provider's ``cap`` of refreshes under way (at least
        one) is free again (one woken wait starts several, not one a refresh's end), or
        until the ``until`` time; True if there is room to start."""
        left = until - self._clock.monotonic()
        if left <= 0.0:
            return False
        loop = self._loop
        assert loop is not None  # set by run(), the only way here
        self._room_at = cap - max(1, cap // 4)
        self._room = room = loop.create_future()
        try:
            async with self._clock.timeout(left):
                await room
        except TimeoutError:
            pass
        finally:
            self._room = None
        return self.stats.in_flight < cap

    def _give_back(self, n: int) -> None:
        if n > 0 and self._allowance is not None:
            self._allowance.refund(n)

    async def _wait_or_stop(self, deadline: float, stop: asyncio.Event) -> bool:
        """Sleep until ``deadline`` unless stopped first; True if stopped."""
        delay = deadline - self._clock.monotonic()
        if delay > 0 and not stop.is_set():
            try:
                async with self._clock.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                pass
        return stop.is_set()

    def _mark_soon(self, owed: int = 0) -> None:
        """Below half a second of marked claims, mark the next second's in the background."""
        want = math.ceil(self._rate * MARK_AHEAD_SECONDS / 2) + owed
        if self._marking is not None or self._marked > want or self._marked >= len(self._queue):
            return
        n = 2 * want + 1
        ids = [c.id for c in islice(self._queue, self._marked, self._marked + n)]
        self._marking = asyncio.create_task(self._mark(ids), name=f"mark-{self.org_code}")

    async def _mark(self, ids: list[int]) -> None:
        try:
            marked = await self._store.mark_started(ids, worker=self._settings.worker_id,
                                                    at=self._clock.now())
        except Exception as exc:
            self.stats.claim_errors += 1
            log.warning("start mark failed; those claims wait", extra={
                "action": "mark_failed", "org_code": self.org_code, "error": describe(exc)})
        else:
            if len(marked) < len(ids):
                self._lost([i for i in ids if i not in marked])
            # Starts take only marked claims, so these still follow the marked ones.
            self._marked += len(marked)
        finally:
            self._marking = None

    def _lost(self, ids: list[int]) -> None:
        """Claims the start mark found no longer ours: revoked since they were claimed (a
        revoked consent is never called again), or leased by another worker that took
        this one for dead (it calls them; two calls would be two transfers). Out of the
        queue, never started, nothing written for them: the row is not ours to write."""
        lost = set(ids)
        keep = [c for c in self._queue if c.id not in lost]
        self._queue.clear()
        self._queue.extend(keep)
        self._held.difference_update(lost)
        self.stats.claims_lost += len(lost)
        log.warning("claims no longer ours at their start mark: dropped", extra={
            "action": "claims_lost", "org_code": self.org_code, "claims": len(lost)})

    async def _marked_now(self, owed: int) -> bool:
        """Wait for a start mark (rare: the background one keeps ahead); False if none."""
        self._mark_soon(owed)
        task = self._marking
        if task is not None:
            await asyncio.shield(task)
        return self._marked > 0

    def _start(self, claim: work.Claim, not_after: float | None) -> None:
        self.stats.started += 1
        self.stats.in_flight += 1
        if self.stats.first_start is None:
            self.stats.first_start = self._clock.monotonic()
        # the loop's own create_task: asyncio.create_task asks for the running loop, a
        # getpid system call each time in Python 3.11 (a refresh's tasks and timeouts made
        # 1.5 of them a call)
        loop = self._loop
        assert loop is not None  # set by run(), the only way here
        key = self._started = self._started + 1
        self._tasks[key] = loop.create_task(self._one(claim, not_after, key),
                                            name=f"refresh-{self.org_code}-{claim.id}")

    async def _one(self, claim: work.Claim, not_after: float | None, key: int) -> None:
        try:
            result = await self._refresh(claim, not_after)
        except asyncio.CancelledError:
            # Cancelled past the grace period: the call may have gone out; unknown.
            result = RefreshResult(Outcome(Kind.TIMEOUT, detail="cancelled at shutdown"),
                                   calls=0)
            self._finish(claim, result)
            raise
        except Exception as exc:  # a bug in one refresh must not stop the day
            log.exception("refresh crashed", extra={"action": "refresh_crashed",
                                                    "org_code": self.org_code,
                                                    "consent_id": claim.id})
            result = RefreshResult(
                Outcome(Kind.CLIENT, detail=f"internal error: {type(exc).__name__}"), calls=0)
        finally:
            del self._tasks[key]
        self._finish(claim, result)

    def _finish(self, claim: work.Claim, result: RefreshResult) -> None:
        t = decide(claim, result, week=self._week, now=self._clock.now(), policy=self._policy)
        self._writer.add(t)  # still held (and its lease renewed) until written
        if result.new_access_token is not None:  # (unsaved_tokens' test: a frame saved)
            tokens = unsaved_tokens(claim, result)
            if tokens is not None:
                self._writer.add(tokens)
        s = self.stats
        s.in_flight -= 1
        room = self._room
        if room is not None and s.in_flight <= self._room_at and not room.done():
            room.set_result(None)
        s.calls += result.calls
        s.by_action[t.step._value_] += 1  # the member's value, not Enum's property
        s.by_kind[t.log.kind] += 1
        if t.log.rsp_code:
            s.by_code[t.log.rsp_code] += 1
        if isinstance(t, DeadLetter):
            s.dead_lettered += 1
        if isinstance(t, NotAttempted):
            s.started -= 1  # it never reached the provider: it is still to do
            if self._allowance is not None:
                self._allowance.refund(1)
        s.last_finish = self._clock.monotonic()

    async def _drain(self, grace: float | None) -> None:
        if not self._tasks:
            return
        pending = set(self._tasks.values())
        if grace is None:
            await asyncio.gather(*pending, return_exceptions=True)
            return
        try:
            async with self._clock.timeout(grace):
                await asyncio.gather(*pending, return_exceptions=True)
        except TimeoutError:
            await cancel_and_wait(pending)

    # -- the day -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, grace: float = 30.0) -> list[int]:
        """Run today's remaining minutes; returns the ids of claims released unstarted."""
        self._loop = asyncio.get_running_loop()
        producer = asyncio.create_task(self._produce(stop), name=f"producer-{self.org_code}")
        try:
            await self._consume(stop)
        finally:
            # Let the producer finish its current claim rather than cancel it mid-transaction.
            self._claiming = False
            self._nudge.set()
            if self._marking is not None:
                await asyncio.gather(self._marking, return_exceptions=True)
            try:
                async with self._clock.timeout(60):
                    await asyncio.shield(producer)
            except (TimeoutError, Exception):
                await cancel_and_wait([producer])
            await self._drain(grace if stop.is_set() else None)
            self.stats.freeze_state()
            leftovers = [c.id for c in self._queue]
            self._queue.clear()
            self._marked = 0
            self._held.difference_update(leftovers)
        if leftovers:
            try:
                await self._store.release(leftovers, worker=self._settings.worker_id)
            except Exception as exc:
                log.warning("release failed; the leases will expire instead", extra={
                    "action": "release_failed", "org_code": self.org_code,
                    "error": type(exc).__name__})
        return leftovers

    @property
    def minutes(self) -> Sequence[int]:
        return self._minutes
