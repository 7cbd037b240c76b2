"""The dispatcher's pacing and lifecycle on a FakeClock with the in-memory store: no sleeps."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import date, datetime, timedelta

import pytest

from batch.client import RefreshResult
from batch.clock import KST, FakeClock
from batch.db.memory import MemoryWorkStore
from batch.db.work import Claim
from batch.dispatch.policy import RetryPolicy
from batch.dispatch.provider import DispatchSettings, ProviderDispatcher
from batch.dispatch.writer import OutcomeWriter
from batch.resilience.outcomes import Kind, Layer, Outcome, rejected

DAY = date(2026, 11, 30)
WEEK = date(2026, 11, 29)
ORG = "BANK000001"
OK = Outcome(Kind.SUCCESS, "00000", 200)


def _setup(n_consents: int, minutes: dict[int, int], *, quota: int | None = None,
           refresh: object = None, breaker_open: object = None,
           start: datetime | None = None, store: MemoryWorkStore | None = None,
           max_in_flight: int | None = None, phase: float = 0.0,
           offset: float | None = None, breaker_state: object = None,
           ) -> tuple[FakeClock, MemoryWorkStore,
                                                   ProviderDispatcher, OutcomeWriter,
                                                   list[tuple[float, int]]]:
    clock = FakeClock(start or datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))
    store = store or MemoryWorkStore()
    store.add(ORG, n_consents, week=WEEK, not_before=clock.now() - timedelta(days=1))
    starts: list[tuple[float, int]] = []

    async def ok_refresh(claim: Claim, not_after: float | None) -> RefreshResult:
        starts.append((clock.monotonic(), claim.id))
        return RefreshResult(OK, calls=2)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=DAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=refresh or ok_refresh, writer=writer,  # type: ignore[arg-type]
        clock=clock, settings=DispatchSettings(worker_id="w1"), policy=RetryPolicy(),
        day=DAY, week=WEEK, quota=sum(minutes.values()) if quota is None else quota,
        minutes=minutes, per_minute_cap=100_000,
        breaker_open=breaker_open or (lambda: False),  # type: ignore[arg-type]
        max_in_flight=None if max_in_flight is None else (lambda: max_in_flight),
        phase=phase, offset=offset,
        **({} if breaker_state is None else {"breaker_state": breaker_state}),
    )
    return clock, store, d, writer, starts


async def _run(clock: FakeClock, d: ProviderDispatcher, writer: OutcomeWriter,
               seconds: float, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    wt = writer.start()
    task = asyncio.create_task(d.run(stop))
    await clock.run_for(seconds)
    await task
    assert await writer.close()
    await wt


async def test_each_minute_starts_exactly_its_target_spread_over_100ms_slices() -> None:
    # 01:00 -> 1200 refreshes, 01:01 -> 600: two per slice, then one per slice.
    clock, store, d, writer, starts = _setup(2000, {60: 1200, 61: 600})
    await _run(clock, d, writer, 200)
    assert len(starts) == 1800
    assert len({cid for _, cid in starts}) == 1800  # nobody twice
    minute_start = 60.0  # the FakeClock began at 00:59:00, monotonic 0
    first = [t for t, _ in starts if minute_start <= t < minute_start + 60]
    second = [t for t, _ in starts if minute_start + 60 <= t < minute_start + 120]
    assert (len(first), len(second)) == (1200, 600)
    per_slice = Counter(round((t - minute_start) * 10) for t in first)
    assert max(per_slice.values()) == 2 and len(per_slice) == 600
    assert d.stats.missed_slices == 0
    assert max(d.stats.lateness) < 1e-9
    assert len(store.outcomes) == 1800
    assert all(store.consents[c].due_week == WEEK + timedelta(days=7) for _, c in starts)


async def test_a_slow_refresh_never_delays_the_next_tick() -> None:
    clock = None

    async def slow(claim: Claim, not_after: float | None) -> RefreshResult:
        assert clock is not None
        await clock.sleep(25)  # far longer than a slice
        return RefreshResult(OK, calls=1)

    clock, _store, d, writer, _ = _setup(120, {60: 120}, refresh=slow)
    await _run(clock, d, writer, 150)
    assert d.stats.missed_slices == 0 and max(d.stats.lateness) < 1e-9
    assert d.stats.succeeded == 120


class _Timed:
    """A refresh that takes ``seconds`` on the test's clock and counts how many are under
    way at once (``peak``); ``clock`` is set once ``_setup`` has made it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.clock: FakeClock | None = None
        self.running = self.peak = 0

    async def __call__(self, claim: Claim, not_after: float | None) -> RefreshResult:
        assert self.clock is not None
        self.running += 1
        self.peak = max(self.peak, self.running)
        await self.clock.sleep(self.seconds)
        self.running -= 1
        return RefreshResult(OK, calls=1)


async def test_starts_wait_while_as_many_refreshes_as_the_provider_takes_are_under_way(
) -> None:
    # 10 a second planned, each refresh takes 2 s, at most 5 under way: 2.5 a second start,
    # the rest wait in the queue (no refusal, no claim and outcome written for nothing)
    slow = _Timed(2)
    clock, store, d, writer, _ = _setup(600, {60: 600}, refresh=slow, max_in_flight=5)
    slow.clock = clock
    await _run(clock, d, writer, 130)
    s = d.stats.summary()
    assert slow.peak == 5
    assert 120 <= s["succeeded"] <= 130 and s["not_attempted"] == 0  # 50 s: finish margin
    assert s["busy_slices"] > 0
    left = [c for c in store.consents.values() if c.due_week == WEEK]
    assert len(left) == 600 - s["succeeded"] and {c.lease_owner for c in left} == {None}


async def test_a_busy_provider_starts_again_as_refreshes_end_not_a_slice_later() -> None:
    # 50 a second planned (5 a slice), each refresh takes 30 ms, at most 5 under way: the
    # starts go on as refreshes end, inside the slice, so the minute's count is met at
    # that concurrency; waiting for the next slice whenever 5 were under way started 5 a
    # slice at most, and the 12 a slice of the second minute (the window's last: 500
    # slices before its finish margin) could never have been met
    quick = _Timed(0.03)
    clock, _store, d, writer, _ = _setup(12_000, {60: 3000, 61: 6000}, refresh=quick,
                                         max_in_flight=5)
    quick.clock = clock
    await _run(clock, d, writer, 200)
    s = d.stats.summary()
    assert quick.peak == 5
    assert s["succeeded"] == 9000 and s["not_attempted"] == 0
    assert [(r.planned, r.started) for r in d.stats.minutes] == [(3000, 3000), (6000, 6000)]
    assert s["busy_slices"] > 0
    assert d.stats.missed_slices == 0


async def test_a_short_minute_is_made_up_in_the_following_minutes() -> None:
    clock, store, d, writer, starts = _setup(300, {60: 100, 61: 100, 62: 100})
    # Only 40 consents can be claimed during the first minute.
    for c in list(store.consents.values())[40:]:
        c.not_before = datetime(2026, 11, 30, 1, 1, 0, tzinfo=KST)
    await _run(clock, d, writer, 250)
    by_minute = Counter(int(t // 60) for t, _ in starts)
    assert by_minute[1] == 40
    assert by_minute[2] + by_minute[3] == 260  # the 60 missing re-spread, nothing lost
    assert by_minute[2] == 130 and by_minute[3] == 130


async def test_open_breaker_starts_nothing_and_leaves_consents_due() -> None:
    clock, store, d, writer, starts = _setup(100, {60: 100}, breaker_open=lambda: True)
    await _run(clock, d, writer, 130)
    assert starts == []
    assert d.stats.skipped_breaker_open == 100
    assert all(c.lease_owner is None and c.due_week == WEEK for c in store.consents.values())


async def test_the_breaker_state_is_the_chains_while_running_and_kept_at_the_end() -> None:
    state = ["closed"]
    clock, _, d, writer, _ = _setup(20, {60: 20}, breaker_state=lambda: state[0])
    assert d.stats.breaker_state == "closed"
    state[0] = "half_open"  # read when asked (a progress line), not at each finish
    assert d.stats.breaker_state == "half_open"
    await _run(clock, d, writer, 130)
    state[0] = "open"  # after the run: the summary keeps the state it ended in
    assert d.stats.summary()["breaker"] == "half_open"


async def test_our_own_rejections_are_not_attempts_and_stay_due() -> None:
    async def refused(claim: Claim, not_after: float | None) -> RefreshResult:
        return RefreshResult(rejected(Layer.LIMITER), calls=0)

    clock, store, d, writer, _ = _setup(50, {60: 50}, refresh=refused)
    await _run(clock, d, writer, 130)
    s = d.stats.summary()
    assert s["attempted"] == 0 and s["not_attempted"] >= 50
    assert all(c.attempts == 0 and c.due_week == WEEK for c in store.consents.values())


async def test_stop_releases_unstarted_claims_and_finishes_in_flight_work() -> None:
    clock, store, d, writer, starts = _setup(6000, {60: 6000})
    stop = asyncio.Event()

    async def stopper() -> None:
        await clock.sleep(90)  # 30 s into the minute
        stop.set()

    stopping = asyncio.create_task(stopper())
    await _run(clock, d, writer, 200, stop=stop)
    await stopping
    # The window is this one minute: its 6000 starts fit in the 50 s before the finish
    # margin, 12 a slice; stopped 30 s in, 3600 have started.
    assert len(starts) == 3600
    leased = [c for c in store.consents.values() if c.lease_owner is not None]
    assert leased == []  # unstarted claims were given back
    assert len(store.outcomes) == len(starts)


async def test_outcomes_survive_a_database_outage_during_the_run() -> None:
    clock, store, d, writer, _starts = _setup(100, {60: 100})
    store.fail_writes = 5
    await _run(clock, d, writer, 130)
    assert writer.failures == 5
    assert len(store.outcomes) == 100


async def test_a_claim_lost_twice_to_unknown_outcomes_is_dead_lettered_not_called() -> None:
    clock, store, d, writer, starts = _setup(3, {60: 3})
    lost = store.consents[1]
    lost.unknown_attempts, lost.counters_week = 1, WEEK
    lost.lease_owner, lost.started_at = "crashed-worker", clock.now() - timedelta(minutes=11)
    lost.lease_until = clock.now() - timedelta(seconds=1)
    await _run(clock, d, writer, 130)
    assert 1 not in {cid for _, cid in starts}
    assert [r["consent_id"] for r in store.dead_letters] == [1]


async def test_no_refresh_starts_in_the_windows_last_seconds_and_calls_stop_at_its_end() -> None:
    seen: list[tuple[float, float | None]] = []
    clock = None

    async def note(claim: Claim, not_after: float | None) -> RefreshResult:
        assert clock is not None
        seen.append((clock.monotonic(), not_after))
        return RefreshResult(OK, calls=1)

    # Window 01:00-01:02 (minutes 60, 61); the FakeClock starts at 00:59:00 = monotonic 0.
    clock, _store, d, writer, _ = _setup(1000, {60: 500, 61: 500}, refresh=note)
    await _run(clock, d, writer, 200)
    assert len(seen) == 1000
    assert max(t for t, _ in seen) < 180 - 10  # finish margin before 01:02
    assert {na for _, na in seen} == {180.0}  # both minutes share the window's end


async def test_leases_are_renewed_while_a_refresh_is_in_flight_so_it_is_never_taken_twice() -> None:
    clock = FakeClock(datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))
    store = MemoryWorkStore()
    store.add(ORG, 5, week=WEEK, not_before=clock.now() - timedelta(days=1))
    started: list[int] = []

    async def slow(claim: Claim, not_after: float | None) -> RefreshResult:
        started.append(claim.id)
        await clock.sleep(100)  # three leases long
        return RefreshResult(OK, calls=1)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=DAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=slow, writer=writer, clock=clock,
        settings=DispatchSettings(worker_id="w1", lease=timedelta(seconds=30)),
        policy=RetryPolicy(), day=DAY, week=WEEK, quota=50,  # more than exists: keeps scanning
        minutes={60: 25, 61: 25}, per_minute_cap=1000,
    )
    await _run(clock, d, writer, 300)
    assert sorted(started) == [1, 2, 3, 4, 5]
    assert all(c.unknown_attempts == 0 for c in store.consents.values())
    assert d.stats.succeeded == 5


async def test_a_consent_due_again_after_a_failure_is_claimed_again_the_same_day() -> None:
    clock = FakeClock(datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))
    store = MemoryWorkStore()
    store.add(ORG, 1, week=WEEK, not_before=clock.now() - timedelta(days=1))
    answers = [Outcome(Kind.FAULT, "50001", 500, retryable=True), OK]
    seen: list[float] = []

    async def flaky(claim: Claim, not_after: float | None) -> RefreshResult:
        seen.append(clock.monotonic())
        return RefreshResult(answers[len(seen) - 1], calls=1)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=DAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=flaky, writer=writer, clock=clock,
        settings=DispatchSettings(worker_id="w1"),
        policy=RetryPolicy(base_delay=timedelta(seconds=30)), day=DAY, week=WEEK, quota=2,
        minutes={60: 1, 61: 1, 62: 0, 63: 0}, per_minute_cap=1000,
        window_minutes=[60, 61, 62, 63],
    )
    await _run(clock, d, writer, 300)
    assert len(seen) == 2 and seen[1] - seen[0] >= 30
    assert store.consents[1].due_week == WEEK + timedelta(days=7)


class SlowMarkStore(MemoryWorkStore):
    """The memory store, whose start marks take 250 ms (on the clock) and are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[int] = []
        self.clock: FakeClock | None = None

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        self.marks.append(len(ids))
        assert self.clock is not None
        await self.clock.sleep(0.25)
        return await super().mark_started(ids, worker=worker, at=at)


async def test_a_claim_is_marked_started_before_its_call_and_a_queued_one_never_is() -> None:
    store = SlowMarkStore()
    unmarked_at_call: list[int] = []

    async def check(claim: Claim, not_after: float | None) -> RefreshResult:
        if store.consents[claim.id].started_at is None:
            unmarked_at_call.append(claim.id)
        return RefreshResult(OK, calls=1)

    clock, _, d, writer, _ = _setup(6000, {60: 6000}, refresh=check, store=store)
    store.clock = clock
    stop = asyncio.Event()

    async def stopper() -> None:
        await clock.sleep(90)  # 30 s into the minute: half the claims still queued
        stop.set()

    stopping = asyncio.create_task(stopper())
    await _run(clock, d, writer, 200, stop=stop)
    await stopping
    assert unmarked_at_call == []
    assert len(store.outcomes) == 3600
    # One statement marks about a second of starts (120/s here), not one per call.
    assert len(store.marks) <= 3600 // 50 and sum(store.marks) >= 3600
    # Released claims carry no start mark: after a crash they would be plainly due.
    assert all(c.started_at is None for c in store.consents.values())


class RevokingStore(MemoryWorkStore):
    """Consents revoked (or their leases taken by another worker) after they were
    claimed, before their start mark: what ``revoke`` or a worker that saw this one dead
    writes between the two."""

    def __init__(self, gone: set[int], taken: set[int]) -> None:
        super().__init__()
        self.gone, self.taken = gone, taken

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        for i in ids:
            c = self.consents[i]
            if i in self.gone and c.status == "active":
                c.status, c.access_token, c.lease_owner, c.lease_until = (
                    "revoked", "", None, None)
            elif i in self.taken and c.lease_owner == worker:
                c.lease_owner = "w2"
        return await super().mark_started(ids, worker=worker, at=at)


async def test_claims_no_longer_ours_at_their_start_mark_are_never_started() -> None:
    """A consent revoked while it sat in the queue is never called (revoked: never called
    again), nor one whose lease another worker took (it calls it: two transfers). The
    minute's count is made up from the rest of the queue."""
    gone, taken = {3, 40, 41}, {7, 90}
    store = RevokingStore(gone, taken)
    clock, _, d, writer, starts = _setup(200, {60: 120}, store=store)
    await _run(clock, d, writer, 150)
    started = {cid for _, cid in starts}
    assert not started & (gone | taken)
    assert len(starts) == 120 and d.stats.claims_lost == 5
    assert d.stats.summary()["claims_lost"] == 5
    assert {(i, store.consents[i].status, store.consents[i].lease_owner)
            for i in gone | taken} == {(3, "revoked", None), (40, "revoked", None),
                                       (41, "revoked", None), (7, "active", "w2"),
                                       (90, "active", "w2")}
    assert not {o["consent_id"] for o in store.outcomes} & (gone | taken)


async def test_a_consent_that_failed_four_times_last_week_is_not_dead_lettered_this_week(
) -> None:
    async def fault(claim: Claim, not_after: float | None) -> RefreshResult:
        return RefreshResult(Outcome(Kind.FAULT, "50001", 500, retryable=True), calls=1)

    clock, store, d, writer, _ = _setup(1, {60: 1}, refresh=fault)
    c = store.consents[1]
    c.due_week, c.attempts, c.counters_week = WEEK - timedelta(days=7), 4, WEEK - timedelta(days=7)
    await _run(clock, d, writer, 130)
    assert store.dead_letters == []
    assert (c.attempts, c.counters_week, c.week_result) == (1, WEEK, "retrying")


async def test_a_token_pair_the_client_could_not_save_is_written_with_the_outcome() -> None:
    async def rotated(claim: Claim, not_after: float | None) -> RefreshResult:
        return RefreshResult(OK, calls=3, new_access_token=f"new-{claim.id}",
                             new_refresh_token=f"rot-{claim.id}")

    clock, store, d, writer, _ = _setup(3, {60: 3}, refresh=rotated)
    await _run(clock, d, writer, 130)
    assert [(c.access_token, c.refresh_token) for c in store.consents.values()] == [
        (f"new-{i}", f"rot-{i}") for i in (1, 2, 3)]
    assert len(store.outcomes) == 3  # a token pair is no outcome


class CountingStore(MemoryWorkStore):
    """The memory store, counting claim queries and when they were made."""

    def __init__(self) -> None:
        super().__init__()
        self.claims_at: list[datetime] = []

    async def claim(self, org_code: str, *, worker: str, week: date, now: datetime,
                    limit: int, after: tuple[date, int] = (date(1970, 1, 1), 0),
                    lease: timedelta = timedelta(minutes=10)) -> list[Claim]:
        self.claims_at.append(now)
        return await super().claim(org_code, worker=worker, week=week, now=now, limit=limit,
                                   after=after, lease=lease)


async def test_a_provider_with_nothing_this_minute_makes_no_claim_query() -> None:
    # The only minute is 01:05; the clock starts at 00:59: five idle minutes first.
    store = CountingStore()
    clock, _, d, writer, starts = _setup(10, {65: 6}, store=store)
    await _run(clock, d, writer, 460)
    assert len(starts) == 6
    first = min(store.claims_at)
    assert first >= datetime(2026, 11, 30, 1, 4, 55, tzinfo=KST)  # just ahead of 01:05
    assert len(store.claims_at) <= 4  # a refill of at least min_claim, not one a second


async def test_a_providers_phase_places_its_starts_not_their_count() -> None:
    # 01:00 -> 120 (2/s): at phase 0.5 the starts fall in other slices than at phase 0,
    # each minute's count the same.
    runs = {}
    for phase in (0.0, 0.5):
        clock, _, d, writer, starts = _setup(300, {60: 120, 61: 120}, phase=phase)
        await _run(clock, d, writer, 200)
        assert len(starts) == 240 and d.stats.missed_slices == 0
        assert [m.started for m in d.stats.minutes] == [120, 120]
        # the first minute's slices, one in five (the second ends its window: 50 s of slices)
        runs[phase] = {round((t - 60.0 - d._offset) * 10) % 5 for t, _ in starts if t < 120}
    assert runs[0.0] == {4} and runs[0.5] == {2}


async def test_a_providers_offset_places_its_ticks_in_the_slice() -> None:
    # 01:00 -> 600 (one a slice): each start at the slice's start plus 0.25 of a slice
    clock, _, d, writer, starts = _setup(600, {60: 600}, offset=0.25)
    await _run(clock, d, writer, 200)
    assert len(starts) == 600 and d.stats.missed_slices == 0
    assert {round((t - 60.0) * 1000) % 100 for t, _ in starts} == {25}
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="offset"):
            _setup(1, {60: 1}, offset=bad)


async def test_a_slow_provider_ticks_only_its_starts_and_still_sees_a_stop() -> None:
    clock, _, d, writer, starts = _setup(10, {60: 6, 61: 6})
    stop = asyncio.Event()
    wt = writer.start()
    task = asyncio.create_task(d.run(stop))
    await clock.run_for(95)  # 01:00:35: starts at 9.9, 19.9, 29.9 s (one every 10 s)
    assert d.stats.summary()["slices"] == 3 and len(starts) == 3
    stop.set()
    await clock.run_for(1.5)
    assert task.done()  # seen within a second, not at the next start 4 s away
    await task
    assert await writer.close()
    await wt
    assert len(starts) == 3


class GrantAll:
    """A cluster allowance that grants what is asked and records what comes back."""

    def __init__(self) -> None:
        self.granted = 0
        self.refunded = 0

    async def take(self, minute: int, due: int, fresh: int, queued: int) -> int:
        g = max(0, min(fresh, queued))
        self.granted += g
        return g

    def refund(self, n: int) -> None:
        self.refunded += n

    async def left(self) -> int | None:
        return None


class SharedDay:
    """The Redis side of a day, in memory: grants never past a minute's cumulative ``due``
    nor the day's quota (GRANT); ``reclaim`` gives a dead run's unused starts back to the
    day, not to the minute (RECLAIM)."""

    def __init__(self, quota: int) -> None:
        self.quota, self.used = quota, 0
        self.by_minute: Counter[int] = Counter()

    async def take(self, minute: int, due: int, fresh: int, queued: int) -> int:
        g = max(0, min(queued, due - self.by_minute[minute], self.quota - self.used))
        self.by_minute[minute] += g
        self.used += g
        return g

    def refund(self, n: int) -> None:
        self.used -= n

    async def left(self) -> int | None:
        return self.quota - self.used

    def reclaim(self, n: int) -> None:
        self.used -= n


async def test_cluster_starts_a_dead_worker_gives_back_in_the_last_minute_are_made() -> None:
    """A worker died holding 30 of the day's 80 starts, granted in the first minute; they
    come back (its death seen) 20 s into the last minute, after its count was made: the
    live worker starts them before the window ends, not "deferred" with time to spare."""
    clock, _, d, writer, starts = _setup(100, {60: 40, 61: 40})
    day = SharedDay(80)
    day.by_minute[60], day.used = 30, 30  # the dead worker's grants
    d._allowance = day

    async def death_seen() -> None:
        await clock.sleep_until(clock.monotonic() + 140)  # 01:01:20
        day.reclaim(30)

    seen = asyncio.create_task(death_seen())
    await _run(clock, d, writer, 200)
    await seen
    assert len(starts) == 80
    assert d.stats.summary()["deferred"] == 0
    late = [t for t, _ in starts if t >= 140]
    assert len(late) >= 30  # the ones given back, spread over what was left of the minute
    assert max(t for t, _ in starts) < 180  # and inside the window


async def test_cluster_last_minute_tops_up_only_what_it_can_still_start() -> None:
    """The day's last minute in cluster mode, nothing more to claim (the rest of the
    day's quota is revoked or another worker's): its count is not topped up with what the
    cluster's day has left, which nothing could start (the minute's count grew at every
    look, 960 planned and 1,382 logged, and its planned-vs-started error with it)."""
    clock, _, d, writer, starts = _setup(50, {60: 40, 61: 40})
    day = SharedDay(80)
    d._allowance = day
    await _run(clock, d, writer, 200)
    assert len(starts) == 50
    assert [(m.minute, m.planned, m.started) for m in d.stats.minutes] == [
        (60, 40, 40), (61, 40, 10)]
    assert d.stats.minute_planned == 40
    assert day.used == 50  # the grants nothing could use went back to the day


class FailingMarkStore(MemoryWorkStore):
    """Start marks fail after the first ``ok`` calls (the database went away)."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    async def mark_started(self, ids: Sequence[int], *, worker: str, at: datetime
                           ) -> set[int]:
        if self.ok <= 0:
            raise ConnectionError("database gone")
        self.ok -= 1
        return await super().mark_started(ids, worker=worker, at=at)


async def test_cluster_starts_granted_and_not_made_go_back_to_the_days_quota() -> None:
    """A grant the worker could not use (no start mark) is the cluster's, not lost with the
    minute: without the refund the workers together run out of quota with work left."""
    store = FailingMarkStore(ok=3)
    clock, _, d, writer, starts = _setup(200, {60: 120}, store=store)
    allowance = GrantAll()
    d._allowance = allowance
    await _run(clock, d, writer, 150)
    assert 0 < len(starts) < 120
    assert allowance.granted > len(starts)
    assert allowance.refunded == allowance.granted - len(starts)


async def test_cluster_starts_granted_while_the_breaker_is_open_go_back() -> None:
    clock, _, d, writer, starts = _setup(50, {60: 30}, breaker_open=lambda: True)
    allowance = GrantAll()
    d._allowance = allowance
    await _run(clock, d, writer, 150)
    assert starts == [] and allowance.granted > 0
    assert allowance.refunded == allowance.granted


class SlowReturnStore(MemoryWorkStore):
    """Outcomes are committed at once, but the writer hears back only ``lag`` seconds
    later (a loaded machine: the claim's answer is read before the commit's)."""

    def __init__(self, clock: FakeClock, lag: float) -> None:
        super().__init__()
        self.clock = clock
        self.lag = lag

    async def apply(self, changes: Sequence[object], *, run_id: str, worker: str,
                    day: date) -> None:
        await super().apply(changes, run_id=run_id, worker=worker, day=day)  # type: ignore[arg-type]
        await self.clock.sleep(self.lag)


async def test_a_consent_our_writer_just_released_and_our_producer_took_again_is_not_lost(
) -> None:
    """A refusal of our own (not attempted) frees the consent at once; a claim made before
    the writer hears its commit finds a consent still "held": it must be given back, not
    left leased to nobody until its lease runs out (it was, for the rest of the day)."""
    clock = FakeClock(datetime(2026, 11, 30, 0, 59, 0, tzinfo=KST))
    store = SlowReturnStore(clock, lag=2.5)
    store.add(ORG, 1, week=WEEK, not_before=clock.now() - timedelta(days=1))
    seen: list[float] = []

    async def refused_once(claim: Claim, not_after: float | None) -> RefreshResult:
        seen.append(clock.monotonic())
        if len(seen) == 1:
            return RefreshResult(rejected(Layer.LIMITER), calls=0)
        return RefreshResult(OK, calls=1)

    writer = OutcomeWriter(store, run_id="r1", worker="w1", day=DAY, clock=clock)
    d = ProviderDispatcher(
        ORG, store=store, refresh=refused_once, writer=writer, clock=clock,
        settings=DispatchSettings(worker_id="w1", idle_recheck=1.0),
        policy=RetryPolicy(), day=DAY, week=WEEK, quota=1,
        minutes={60: 1, 61: 1, 62: 1}, per_minute_cap=1000, window_minutes=[60, 61, 62],
    )
    await _run(clock, d, writer, 400)
    assert len(seen) == 2, seen
    c = store.consents[1]
    assert c.due_week == WEEK + timedelta(days=7) and c.lease_owner is None


async def test_a_run_started_halfway_through_the_days_last_minute_starts_all_that_is_left(
) -> None:
    """A restart at 01:01:30 (the window 01:00-01:02): the last minute has no later one to
    take the rest, so its whole remaining count is started, not half of it."""
    clock, _, d, writer, starts = _setup(
        300, {60: 100, 61: 100}, quota=200,
        start=datetime(2026, 11, 30, 1, 1, 30, tzinfo=KST))
    await _run(clock, d, writer, 120)
    assert len(starts) == 200
    assert d.remaining == 0


async def test_a_run_started_halfway_through_an_earlier_minute_leaves_the_rest_to_later_ones(
) -> None:
    clock, _, d, writer, starts = _setup(
        300, {60: 100, 61: 100, 62: 100}, quota=300,
        start=datetime(2026, 11, 30, 1, 0, 30, tzinfo=KST))
    await _run(clock, d, writer, 200)
    assert len(starts) == 300
    first = sum(1 for t, _ in starts if t < 30)  # what is left of 01:00 (the clock's 0)
    assert 40 <= first <= 60  # half a minute, half its count: no burst of all of it
