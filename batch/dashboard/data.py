"""What the dashboard reads: one snapshot of a week's plan, outcomes, usage and run health.

Every query names its columns; the consents table is never read, so access and refresh
tokens cannot reach the page or the JSON.

Units, as in the planner: user calls and batch *calls* are API calls; ``batch_quota`` and
``batch_done`` are *consents* (one refresh each). A consent costs the provider's
``calls_per_consent`` calls (``institutions.options``), so planned batch calls are
``round(batch_quota * calls_per_consent)``, exactly the planner's ``batch_calls`` column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, inspect, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batch.db import schema
from batch.db.engine import connect
from batch.dispatch.summary import RunSummary, SummaryError
from batch.errors import ConfigError
from batch.planner import DEFAULT_CALLS_PER_CONSENT, calls_per_consent_from_options
from planning.calendar import KST, week_start

DONE = "done"
RUNS_SHOWN = 10
DEAD_LETTERS_SHOWN = 10


@dataclass(frozen=True, slots=True)
class DayLoad:
    """One provider's load on one day.

    Calls: ``forecast_user_calls``, ``actual_user_calls``, ``batch_planned_calls`` (the
    quota x calls per consent) and ``batch_calls_made`` (every outcome's calls that day).
    Consents: ``batch_quota`` (planned), ``batch_done`` (outcomes with action done),
    ``capacity`` and ``unplaceable``. ``ran``: the day is past or has outcomes, so its
    actual batch calls mean something.
    """

    org_code: str
    day: date
    forecast_user_calls: int | None
    actual_user_calls: int | None
    batch_quota: int | None
    batch_done: int
    capacity: int | None = None
    unplaceable: int = 0
    batch_planned_calls: int | None = None
    batch_calls_made: int = 0
    ran: bool = False
    #: consents of an earlier week in the day's planned quota (levelled, claimed first)
    overdue: int = 0

    def __post_init__(self) -> None:
        if (self.batch_quota is None) != (self.batch_planned_calls is None):
            raise ValueError("batch_quota and batch_planned_calls are both known or both not")

    @property
    def user_calls(self) -> int:
        """Actual user calls where known, else the forecast, else 0."""
        if self.actual_user_calls is not None:
            return self.actual_user_calls
        return self.forecast_user_calls or 0

    @property
    def planned_consents(self) -> int:
        return self.batch_quota or 0

    @property
    def planned_calls(self) -> int:
        return self.batch_planned_calls or 0

    @property
    def total_planned_calls(self) -> int:
        """User calls plus the planned batch calls: the load the plan levels."""
        return self.user_calls + self.planned_calls

    @property
    def total_actual_calls(self) -> int | None:
        """User calls plus the batch calls actually made; None before the day has run."""
        return self.user_calls + self.batch_calls_made if self.ran else None


@dataclass(frozen=True, slots=True)
class RunTotals:
    """The sums over providers of a run's end-of-run summary."""

    planned: int
    attempted: int
    succeeded: int
    failed: int
    deferred: int
    dead_lettered: int
    #: the day's quota a run left that was revoked, or refreshed by another run, meanwhile
    #: (not deferred: the summary's ``no_longer_due``)
    no_longer_due: int = 0


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: str
    day: date
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    status: str
    totals: RunTotals | None
    #: why a failed run failed
    error: str | None = None


@dataclass(frozen=True, slots=True)
class OutcomeCount:
    """Refresh outcomes of one kind and action for one provider on the focus day."""

    org_code: str
    kind: str
    action: str
    count: int
    calls: int


@dataclass(frozen=True, slots=True)
class DeadLetterGroup:
    """Open dead letters (not yet requeued) of one provider."""

    org_code: str
    count: int
    oldest: datetime


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    consent_id: int
    org_code: str
    week_start: date
    attempts: int
    last_error: str | None
    entered_at: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one page shows, read at ``generated_at``."""

    week_start: date
    today: date
    focus_day: date
    generated_at: datetime
    providers: tuple[str, ...]
    loads: tuple[DayLoad, ...]
    runs: tuple[RunRow, ...]
    outcomes: tuple[OutcomeCount, ...]
    dead_letter_groups: tuple[DeadLetterGroup, ...]
    dead_letters: tuple[DeadLetter, ...]
    #: planned refreshes due by ``generated_at`` on the focus day, per provider, from
    #: plan_minutes; absent when that day has no minute plan.
    expected_by_now: tuple[tuple[str, int], ...] = ()
    #: calls per consent of each provider, as the planner reads it
    calls_per_consent: tuple[tuple[str, float], ...] = ()
    #: institutions whose options the planner would refuse (their calls assume the default)
    config_errors: tuple[str, ...] = ()
    _index: dict[tuple[str, date], DayLoad] = field(
        init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {(x.org_code, x.day): x for x in self.loads})
        if self.week_start.weekday() != 6:
            raise ValueError(f"week_start {self.week_start} is not a Sunday")
        if not self.week_start <= self.focus_day < self.week_start + timedelta(days=7):
            raise ValueError(f"focus_day {self.focus_day} is outside the week")

    @property
    def days(self) -> list[date]:
        return [self.week_start + timedelta(days=i) for i in range(7)]

    @property
    def has_plan(self) -> bool:
        return any(load.batch_quota is not None for load in self.loads)

    def load(self, org_code: str, day: date) -> DayLoad:
        """The provider's day; an empty one when nothing is known about it."""
        found = self._index.get((org_code, day))
        if found is not None:
            return found
        return DayLoad(org_code, day, None, None, None, 0, ran=day < self.today)

    def overdue(self, org_code: str) -> int:
        """Consents of an earlier week still planned from the focus day on."""
        return sum(x.overdue for x in self.loads
                   if x.org_code == org_code and x.day >= self.focus_day)

    def cpc(self, org_code: str) -> float | None:
        """The provider's calls per consent; None for an unknown provider."""
        return dict(self.calls_per_consent).get(org_code)


def focus_day_for(week: date, today: date) -> date:
    """Today inside the current week; the last day of a past week; the first of a future one."""
    start = week_start(week)
    end = start + timedelta(days=6)
    return min(max(today, start), end)


def parse_run_totals(summary: str | None) -> RunTotals | None:
    """A run's stored summary (``RunSummary``) summed over providers; None when absent or
    not that shape."""
    if not summary:
        return None
    try:
        run = RunSummary.from_json(summary)
    except SummaryError:
        return None
    t = run.totals
    gone = sum(n for p in run.providers
               if isinstance(n := p.extra.get("no_longer_due"), int) and n > 0)
    return RunTotals(planned=t["planned"], attempted=t["attempted"], succeeded=t["succeeded"],
                     failed=t["failed"], deferred=t["deferred"],
                     dead_lettered=t["dead_lettered"], no_longer_due=gone)


def _s(value: Any) -> str:
    # PostgreSQL CHAR(n) pads; the codes are fixed-width, strip just in case.
    return str(value).strip()


async def load_snapshot(engine: AsyncEngine, *, week: date, now: datetime) -> Snapshot:
    """Read the week holding ``week`` as seen at ``now`` (aware; its KST date is today)."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    start = week_start(week)
    end = start + timedelta(days=6)
    local = now.astimezone(KST)
    today = local.date()
    focus = focus_day_for(start, today)
    async with connect(engine) as conn:
        if not await conn.run_sync(lambda c: inspect(c).has_table(schema.plan_days.name)):
            # Not initialised yet: an empty week, whose page says how to start.
            return Snapshot(start, today, focus, now, (), (), (), (), (), ())
        cpc, errors = await _calls_per_consent(conn)
        providers = list(cpc)
        counts = await _outcome_counts(conn, providers, start, end)
        loads = await _loads(conn, start, end, today, counts, cpc)
        runs = await _runs(conn, start, end)
        outcomes = _outcomes_on(counts, focus)
        groups, letters = await _dead_letters(conn)
        expected: tuple[tuple[str, int], ...] = ()
        if focus == today:
            expected = await _expected_by_now(conn, today, local.hour * 60 + local.minute)
    return Snapshot(
        week_start=start, today=today, focus_day=focus, generated_at=now,
        providers=tuple(sorted(set(providers) | {x.org_code for x in loads})),
        loads=loads, runs=runs, outcomes=outcomes, dead_letter_groups=groups,
        dead_letters=letters, expected_by_now=expected,
        calls_per_consent=tuple(sorted(cpc.items())), config_errors=errors,
    )


async def _calls_per_consent(conn: AsyncConnection) -> tuple[dict[str, float],
                                                              tuple[str, ...]]:
    """Each provider's calls per consent, parsed as the planner parses it. A row the planner
    would refuse still shows (with the default) but its error is reported, not hidden."""
    inst = schema.institutions
    rows = await conn.execute(select(inst.c.org_code, inst.c.options))
    out: dict[str, float] = {}
    errors: list[str] = []
    for r in rows:
        org = _s(r.org_code)
        try:
            out[org] = calls_per_consent_from_options(org, r.options)
        except ConfigError as exc:
            out[org] = DEFAULT_CALLS_PER_CONSENT
            errors.append(f"{exc}; its batch calls assume the default "
                          f"{DEFAULT_CALLS_PER_CONSENT:g}")
    return out, tuple(sorted(errors))


async def _loads(
    conn: AsyncConnection, start: date, end: date, today: date,
    counts: list[OutcomeDayCount], cpc: dict[str, float],
) -> tuple[DayLoad, ...]:
    pd_, ud = schema.plan_days, schema.usage_daily
    cells: dict[tuple[str, date], dict[str, Any]] = {}

    def cell(org: Any, day: date) -> dict[str, Any]:
        return cells.setdefault((_s(org), day), {})

    rows = await conn.execute(
        select(pd_.c.org_code, pd_.c.day, pd_.c.forecast_user_calls, pd_.c.batch_quota,
               pd_.c.capacity, pd_.c.unplaceable, pd_.c.overdue)
        .where(pd_.c.day.between(start, end)))
    for r in rows:
        cell(r.org_code, r.day).update(
            forecast_user_calls=int(r.forecast_user_calls), batch_quota=int(r.batch_quota),
            capacity=int(r.capacity), unplaceable=int(r.unplaceable), overdue=int(r.overdue))
    rows = await conn.execute(
        select(ud.c.org_code, ud.c.day, ud.c.user_calls).where(ud.c.day.between(start, end)))
    for r in rows:
        cell(r.org_code, r.day)["actual_user_calls"] = int(r.user_calls)
    for c in counts:
        done = cell(c.org_code, c.day)
        done["calls_made"] = done.get("calls_made", 0) + c.calls
        done["ran"] = True
        if c.action == DONE:
            done["batch_done"] = done.get("batch_done", 0) + c.count
    return tuple(
        DayLoad(org_code=org, day=day,
                forecast_user_calls=v.get("forecast_user_calls"),
                actual_user_calls=v.get("actual_user_calls"),
                batch_quota=v.get("batch_quota"), batch_done=v.get("batch_done", 0),
                capacity=v.get("capacity"), unplaceable=v.get("unplaceable", 0),
                batch_planned_calls=_planned_calls(v.get("batch_quota"), org, cpc),
                batch_calls_made=v.get("calls_made", 0),
                ran=v.get("ran", False) or day < today, overdue=v.get("overdue", 0))
        for (org, day), v in sorted(cells.items())
    )


def _planned_calls(quota: int | None, org: str, cpc: dict[str, float]) -> int | None:
    # rounded per provider and day, as the planner's batch_calls column is
    if quota is None:
        return None
    return round(quota * cpc.get(org, DEFAULT_CALLS_PER_CONSENT))


async def _runs(conn: AsyncConnection, start: date, end: date) -> tuple[RunRow, ...]:
    r_ = schema.runs
    rows = await conn.execute(
        select(r_.c.run_id, r_.c.day, r_.c.worker_id, r_.c.started_at, r_.c.finished_at,
               r_.c.status, r_.c.summary, r_.c.error)
        .where(r_.c.day.between(start, end))
        .order_by(r_.c.started_at.desc(), r_.c.run_id).limit(RUNS_SHOWN))
    return tuple(
        RunRow(run_id=r.run_id, day=r.day, worker_id=r.worker_id, started_at=r.started_at,
               finished_at=r.finished_at, status=r.status,
               totals=parse_run_totals(r.summary), error=r.error)
        for r in rows
    )


@dataclass(frozen=True, slots=True)
class OutcomeDayCount:
    org_code: str
    day: date
    kind: str
    action: str
    count: int
    calls: int


async def _outcome_counts(
    conn: AsyncConnection, providers: list[str], start: date, end: date,
) -> list[OutcomeDayCount]:
    """Outcomes per provider, day, kind and action over the week: one pass over the rows."""
    co = schema.call_outcomes
    # org_code leads so the (org_code, day) index narrows the scan to the week: about
    # 2x faster than a day-only filter on PostgreSQL with 8 weeks of history.
    where = and_(co.c.org_code.in_(providers), co.c.day.between(start, end))
    rows = await conn.execute(
        select(co.c.org_code, co.c.day, co.c.kind, co.c.action, func.count().label("n"),
               func.coalesce(func.sum(co.c.calls), 0).label("calls"))
        .where(where)
        .group_by(co.c.org_code, co.c.day, co.c.kind, co.c.action))
    return [OutcomeDayCount(_s(r.org_code), r.day, r.kind, r.action, int(r.n), int(r.calls))
            for r in rows]


def _outcomes_on(counts: list[OutcomeDayCount], day: date) -> tuple[OutcomeCount, ...]:
    found = [OutcomeCount(c.org_code, c.kind, c.action, c.count, c.calls)
             for c in counts if c.day == day]
    return tuple(sorted(found, key=lambda o: (o.org_code, o.kind, o.action)))


async def _dead_letters(
    conn: AsyncConnection,
) -> tuple[tuple[DeadLetterGroup, ...], tuple[DeadLetter, ...]]:
    dl = schema.dead_letters
    open_ = dl.c.requeued_at.is_(None)
    rows = await conn.execute(
        select(dl.c.org_code, func.count().label("n"), func.min(dl.c.entered_at).label("oldest"))
        .where(open_).group_by(dl.c.org_code).order_by(dl.c.org_code))
    groups = tuple(DeadLetterGroup(_s(r.org_code), int(r.n), r.oldest) for r in rows)
    rows = await conn.execute(
        select(dl.c.id, dl.c.consent_id, dl.c.org_code, dl.c.week_start, dl.c.attempts,
               dl.c.last_error, dl.c.entered_at)
        .where(open_).order_by(dl.c.entered_at.desc(), dl.c.id.desc()).limit(DEAD_LETTERS_SHOWN))
    letters = tuple(
        DeadLetter(id=int(r.id), consent_id=int(r.consent_id), org_code=_s(r.org_code),
                   week_start=r.week_start, attempts=int(r.attempts), last_error=r.last_error,
                   entered_at=r.entered_at)
        for r in rows
    )
    return groups, letters


async def _expected_by_now(
    conn: AsyncConnection, day: date, minute_of_day: int,
) -> tuple[tuple[str, int], ...]:
    pm = schema.plan_minutes
    rows = await conn.execute(
        select(pm.c.org_code,
               # the minutes already begun count as due
               func.sum(case((pm.c.minute <= minute_of_day, pm.c.target), else_=0))
               .label("due"))
        .where(pm.c.day == day).group_by(pm.c.org_code))
    return tuple(sorted((_s(r.org_code), int(r.due or 0)) for r in rows))
