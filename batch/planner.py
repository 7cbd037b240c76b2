"""The planner's database side: read what is due, level the week, save and load plans.

What is due is counted in SQL by class (provider, backlog or not, release day), never
loaded row by row. Days of the week before ``today`` keep what actually happened (distinct
consents with an outcome that day); ``today``..Saturday are re-levelled over what is still
due, so each night's plan absorbs the previous days' failures and deferrals.

A consent is released onto the first day with a window minute at or after its
``not_before`` (planning/release.py); one that no window minute of the week can take is
unplaceable, never silently dropped. Backlog (due in an earlier week) is due this week like
everything else: levelled over the week, and claimed first within each day (the claim order
is ``(due_week, id)``); the plan counts it per provider and day as ``overdue``. Each saved
day remembers what it was made from (the provider's limits and the load generation), so a
plan made under other settings, or before consents or institutions were loaded again, is
found stale (:func:`stale_reasons`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import Select, String, case, column, delete, func, insert, select, values
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.config import Provider
from batch.db import schema
from batch.db.engine import connect, transaction
from batch.db.marks import load_generation, loaded_since
from batch.errors import ConfigError, InputError
from planning import minutes as minute_plan
from planning import quotas, usage
from planning.calendar import KST, week_days, week_start
from planning.release import last_starts, usable_minutes
from planning.windows import Window, day_minutes

DEFAULT_CALLS_PER_CONSENT = 3.0
HISTORY_DAYS = usage.MAX_HISTORY_DAYS
DAY_COLUMNS = ["org_code", "date", "forecast_user_calls", "batch_quota", "batch_calls",
               "total", "capacity", "unplaceable", "overdue", "planned", "limits_key"]
#: A bound no consent's not_before reaches: a day with no usable minute releases nothing.
_NEVER = datetime(1900, 1, 1, tzinfo=KST)
_INSERT_CHUNK = 5000


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """What the planner needs of one provider: its windows and how many consents a minute."""

    org_code: str
    windows: tuple[Window, ...]
    calls_per_second: float
    calls_per_consent: float

    def __post_init__(self) -> None:
        if not self.calls_per_second > 0:
            raise ValueError("calls_per_second must be > 0")
        if not (math.isfinite(self.calls_per_consent) and self.calls_per_consent > 0):
            raise ValueError("calls_per_consent must be a positive number")

    @classmethod
    def from_provider(cls, provider: Provider) -> ProviderLimits:
        """The limits of a loaded provider (``calls_per_consent`` from its extra keys)."""
        cpc = provider.extra.get("calls_per_consent", DEFAULT_CALLS_PER_CONSENT)
        if isinstance(cpc, bool) or not isinstance(cpc, int | float) or not cpc > 0:
            raise ConfigError(f"institution {provider.org_code}: calls_per_consent must be a "
                              "positive number", field="calls_per_consent")
        return cls(provider.org_code, provider.windows, provider.calls_per_second, float(cpc))

    @property
    def per_minute_cap(self) -> int:
        """Consents a minute: floor(calls_per_second * 60 / calls_per_consent)."""
        return math.floor(self.calls_per_second * 60 / self.calls_per_consent + 1e-9)

    @property
    def key(self) -> str:
        """What a plan made under these limits depends on, as one readable text."""
        return (f"{','.join(str(w) for w in self.windows)}|{self.calls_per_second:g}"
                f"|{self.calls_per_consent:g}")

    def with_windows(self, windows: tuple[Window, ...] | None) -> ProviderLimits:
        """These limits under other windows (a ``--window-override``); self when None."""
        if windows is None:
            return self
        return ProviderLimits(self.org_code, windows, self.calls_per_second,
                              self.calls_per_consent)


@dataclass(frozen=True, slots=True)
class DayPlan:
    """One provider's plan for one day, as the dispatcher reads it.

    ``batch_quota`` is the day's whole quota; ``minutes`` (minute of day -> target) covers
    the minutes still ahead when the plan was made, so after a mid-day re-plan it sums to
    the quota minus what had already been attempted that day.
    """

    org_code: str
    day: date
    batch_quota: int
    minutes: dict[int, int]
    created_at: datetime | None = None
    #: :attr:`ProviderLimits.key` of the limits (and windows) the day was planned under
    limits_key: str | None = None
    #: the load generation the plan was made at (batch/db/marks.py)
    load_generation: int | None = None
    overdue: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class WeekPlan:
    """A week's plan: per provider and day (``days``) and per planned minute (``minutes``).

    ``days`` columns: org_code, date, forecast_user_calls, batch_quota (consents),
    batch_calls (= batch_quota x calls per consent), total (user + batch calls), capacity
    (consents), unplaceable (consents that fit nowhere, on their deadline day), overdue
    (consents of an earlier week among the day's quota), planned (False for days before
    ``today``: what actually happened), limits_key (the limits the day was planned under).
    ``minutes``: org_code, date, minute, target, for planned days and minutes with a target
    above zero. ``load_generation``: the loads the plan was made after.
    """

    week_start: date
    today: date
    created_at: datetime
    days: pd.DataFrame
    minutes: pd.DataFrame
    limits: dict[str, ProviderLimits]
    load_generation: int = 0
    #: windows that replaced every provider's own for ``today`` (``run --window-override``)
    today_windows: tuple[Window, ...] | None = None

    @property
    def week(self) -> list[date]:
        return week_days(self.week_start)

    @property
    def planned_days(self) -> list[date]:
        return [d for d in self.week if d >= self.today]

    def unplaceable(self) -> dict[str, int]:
        """Consents that cannot fit this week, per provider (only providers with some)."""
        s = self.days.groupby("org_code")["unplaceable"].sum()
        return {str(k): int(v) for k, v in s.items() if v > 0}

    def day_plans(self, day: date) -> dict[str, DayPlan]:
        """The plan of ``day`` per provider, as :func:`load_day_plan` would return it."""
        rows = self.days[(self.days["date"] == day) & self.days["planned"]]
        mins = self.minutes[self.minutes["date"] == day]
        by_org = {str(k): g for k, g in mins.groupby("org_code")}
        out: dict[str, DayPlan] = {}
        for org, quota, key, overdue in zip(rows["org_code"], rows["batch_quota"],
                                            rows["limits_key"], rows["overdue"], strict=True):
            g = by_org.get(str(org))
            m = {} if g is None else {int(a): int(b) for a, b in
                                      zip(g["minute"], g["target"], strict=True)}
            out[str(org)] = DayPlan(str(org), day, int(quota), m, created_at=self.created_at,
                                    limits_key=str(key), load_generation=self.load_generation,
                                    overdue=int(overdue))
        return out

    def overdue(self) -> dict[str, int]:
        """Consents of an earlier week planned from today on, per provider (all providers)."""
        rows = self.days[self.days["planned"]]
        s = rows.groupby("org_code")["overdue"].sum()
        return {str(k): int(v) for k, v in s.items()}


def _kst_midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=KST)


def calls_per_consent_from_options(org_code: str, options: str | None) -> float:
    """``calls_per_consent`` of an ``institutions.options`` JSON text (default when absent);
    a ConfigError naming the provider when it is not JSON or not a positive number."""
    try:
        opts = json.loads(options or "{}")
    except json.JSONDecodeError:
        raise ConfigError(f"institution {org_code}: options are not JSON",
                          field="options") from None
    cpc = opts.get("calls_per_consent", DEFAULT_CALLS_PER_CONSENT) if isinstance(
        opts, dict) else DEFAULT_CALLS_PER_CONSENT
    if (isinstance(cpc, bool) or not isinstance(cpc, int | float) or not cpc > 0
            or not math.isfinite(cpc)):
        raise ConfigError(f"institution {org_code}: calls_per_consent must be a positive "
                          "number", field="calls_per_consent")
    return float(cpc)


def window_minutes(limits: ProviderLimits, day: date, now: datetime) -> list[int]:
    """Minutes of ``day`` still usable at ``now``: all, those starting at or after now, or
    none (a day already past)."""
    return usable_minutes(limits.windows, day, now)


def release_bounds(limits: dict[str, ProviderLimits], planned: Sequence[date],
                   now: datetime, today_windows: tuple[Window, ...] | None = None
                   ) -> dict[str, list[datetime | None]]:
    """Per provider, the start of each planned day's last usable minute (None: no minute);
    ``planned[0]`` is today, whose windows ``today_windows`` replace when given."""
    return {org: last_starts(planned, [
        window_minutes(_on(lim, d, planned[0], today_windows), d, now) for d in planned])
        for org, lim in limits.items()}


def due_classes_query(sunday: date, planned: Sequence[date],
                      bounds: dict[str, list[datetime | None]]) -> Select[Any]:
    """Due consents counted by (org_code, backlog, release bucket) in SQL.

    Bucket ``i`` means release on ``planned[i]``: the first day whose last usable minute
    (``bounds[org][i]``) starts at or after the consent's ``not_before``; ``len(planned)``
    means no window minute of the week can take it. Providers without bounds are left out.
    """
    c = schema.consents
    if not bounds:
        bounds = {"": [None] * len(planned)}
    cols = [column(f"b{i}", schema.UTCDateTime()) for i in range(len(planned))]
    table = values(column("org_code", String), *cols, name="bounds").data(
        [(org, *[b or _NEVER for b in bs]) for org, bs in sorted(bounds.items())]
    ).cte("bounds")
    bucket = case(*[(c.c.not_before <= table.c[f"b{i}"], i) for i in range(len(planned))],
                  else_=len(planned))
    backlog = case((c.c.due_week < sunday, 1), else_=0)
    inner = (
        select(c.c.org_code.label("org_code"), backlog.label("backlog"),
               bucket.label("bucket"))
        .select_from(c.join(table, table.c.org_code == c.c.org_code))
        .where(c.c.status == "active", c.c.due_week <= sunday)
        .subquery()
    )
    return (
        select(inner.c.org_code, inner.c.backlog, inner.c.bucket, func.count().label("n"))
        .group_by(inner.c.org_code, inner.c.backlog, inner.c.bucket)
    )


async def _read(engine: AsyncEngine, sunday: date, today: date, now: datetime,
                planned: list[date], today_windows: tuple[Window, ...] | None
                ) -> tuple[dict[str, ProviderLimits], pd.DataFrame, pd.DataFrame, pd.DataFrame,
                           int]:
    from batch.db.loaders import read_providers

    ud = schema.usage_daily
    co = schema.call_outcomes
    attempted_until = today if now.astimezone(KST).date() >= today else today - timedelta(days=1)
    async with connect(engine) as conn:
        generation = await load_generation(conn)
        providers = await read_providers(conn)  # the one reader of stored institutions
        limits = {p.org_code: ProviderLimits.from_provider(p) for p in providers}
        bounds = release_bounds(limits, planned, now, today_windows)
        classes = (await conn.execute(due_classes_query(sunday, planned, bounds))).all()
        hist = (await conn.execute(
            select(ud.c.org_code, ud.c.day, ud.c.user_calls)
            .where(ud.c.day >= min(sunday, today) - timedelta(days=HISTORY_DAYS),
                   ud.c.day < sunday + timedelta(days=7))
        )).all()
        done = (await conn.execute(
            select(co.c.org_code, co.c.day, func.count(func.distinct(co.c.consent_id)))
            .where(co.c.day >= sunday, co.c.day <= attempted_until,
                   co.c.action != "not_attempted")
            .group_by(co.c.org_code, co.c.day)
        )).all()
    cls = pd.DataFrame([(str(a).strip(), int(b), int(k), int(n)) for a, b, k, n in classes],
                       columns=["org_code", "backlog", "bucket", "count"])
    hist_df = pd.DataFrame([(str(a).strip(), d, int(n)) for a, d, n in hist],
                           columns=["org_code", "date", "user_calls"])
    done_df = pd.DataFrame([(str(a).strip(), d, int(n)) for a, d, n in done],
                           columns=["org_code", "date", "attempted"])
    return limits, cls, hist_df, done_df, generation


def _on(lim: ProviderLimits, day: date, today: date,
        today_windows: tuple[Window, ...] | None) -> ProviderLimits:
    """The limits in force on ``day``: ``today_windows`` replace the windows of today."""
    return lim.with_windows(today_windows) if day == today else lim


async def build_week_plan(engine: AsyncEngine, *, week_of: date, today: date,
                          now: datetime,
                          today_windows: tuple[Window, ...] | None = None) -> WeekPlan:
    """Plan the week holding ``week_of`` as seen on ``today`` at ``now`` (aware).

    ``today_windows`` (``run --window-override``) replace every provider's windows for
    ``today`` only: today's capacity and minutes are those of the override from ``now``.
    """
    sunday = week_start(week_of)
    week = week_days(sunday)
    if not sunday <= today <= week[-1]:
        raise InputError(f"today {today} is not in the week {sunday}..{week[-1]}")
    if now.tzinfo is None:
        raise InputError("now must be timezone-aware")
    planned = [d for d in week if d >= today]
    limits, cls, hist, done, generation = await _read(engine, sunday, today, now, planned,
                                                      today_windows)
    orgs = sorted(limits)

    # Planned days are forecast from everything before today; days already past show the
    # actual user calls, or (none recorded) what was forecast from before the week.
    actual = {(o, d): float(n) for o, d, n in
              zip(hist["org_code"], hist["date"], hist["user_calls"], strict=True) if d < today}
    forecast: dict[tuple[str, date], float] = {}
    if orgs:
        fc = usage.forecast(hist[hist["date"] < today], planned, orgs)
        past = [d for d in week if d < today]
        if past and any((o, d) not in actual for o in orgs for d in past):
            fc = pd.concat([usage.forecast(hist[hist["date"] < sunday], past, orgs), fc])
        forecast = {(o, d): v for o, d, v in
                    zip(fc["org_code"], fc["date"], fc["forecast_user_calls"], strict=True)}
    forecast.update(actual)
    attempted = {(o, d): n for o, d, n in zip(done["org_code"], done["date"],
                                              done["attempted"], strict=True)}

    # Planned days: base load = forecast users + what already ran today.
    day_rows = []
    for org in orgs:
        for d in planned:
            lim = _on(limits[org], d, today, today_windows)
            fixed = attempted.get((org, d), 0) if d == today else 0
            cap = sum(minute_plan.minute_caps(window_minutes(lim, d, now),
                                              lim.per_minute_cap))
            day_rows.append((org, d, forecast.get((org, d), 0.0)
                             + lim.calls_per_consent * fixed, cap, fixed))
    days_df = pd.DataFrame(day_rows, columns=["org_code", "date", "base_load", "capacity",
                                              "fixed"])
    class_rows = []
    last = len(planned)
    late: dict[str, int] = {}           # due this week, after the week's last window minute
    backlog_by: dict[tuple[str, date], int] = {}
    for org, backlog, bucket, n in zip(cls["org_code"], cls["backlog"], cls["bucket"],
                                       cls["count"], strict=True):
        if org not in limits:
            continue  # an unknown provider
        if bucket >= last:
            late[org] = late.get(org, 0) + int(n)
            continue
        release = planned[bucket]
        # Backlog is due this week like the rest (one transfer a week, not a catch-up):
        # levelled up to Saturday; the claim order (due_week, id) takes it first each day.
        class_rows.append((org, release, planned[-1], n))
        if backlog:
            backlog_by[(org, release)] = backlog_by.get((org, release), 0) + int(n)
    classes = pd.DataFrame(class_rows, columns=["org_code", "release", "deadline", "count"])
    classes = pd.DataFrame(classes.groupby(["org_code", "release", "deadline"],
                                           as_index=False)["count"].sum())
    weights = {o: limits[o].calls_per_consent for o in orgs}
    leveled = quotas.plan_quotas(days_df, classes, weights)
    for org, n in late.items():        # they miss their week: said on Saturday, not hidden
        at = (leveled["org_code"] == org) & (leveled["date"] == planned[-1])
        leveled.loc[at, "unplaceable"] = leveled.loc[at, "unplaceable"] + n

    out_rows: list[tuple[Any, ...]] = []
    minute_frames: list[pd.DataFrame] = []
    lev = {(o, d): (int(q), int(u), int(f), int(c)) for o, d, q, u, f, c in zip(
        leveled["org_code"], leveled["date"], leveled["batch_quota"], leveled["unplaceable"],
        leveled["fixed"], leveled["capacity"], strict=True)}
    for org in orgs:
        full_cap = sum(minute_plan.minute_caps(day_minutes(limits[org].windows),
                                               limits[org].per_minute_cap))
        backlog_left = 0
        for d in week:
            lim = _on(limits[org], d, today, today_windows)
            user = round(forecast.get((org, d), 0.0))
            overdue = 0
            if d < today:
                q, unpl, cap, is_planned = attempted.get((org, d), 0), 0, full_cap, False
            else:
                new, unpl, fixed, cap = lev[(org, d)]
                q, is_planned = new + fixed, True
                # backlog is claimed first: it fills each day's new quota before the rest
                backlog_left += backlog_by.get((org, d), 0)
                overdue = min(new, backlog_left)
                backlog_left -= overdue
                if new:
                    mins = window_minutes(lim, d, now)
                    s = minute_plan.spread(new, mins,
                                           minute_plan.minute_caps(mins, lim.per_minute_cap))
                    s = s[s > 0]
                    minute_frames.append(pd.DataFrame({
                        "org_code": org, "date": d, "minute": s.index.to_numpy(),
                        "target": s.to_numpy()}))
            batch_calls = round(q * lim.calls_per_consent)
            out_rows.append((org, d, user, q, batch_calls, user + batch_calls, cap, unpl,
                             overdue, is_planned, lim.key))
    days_out = pd.DataFrame(out_rows, columns=DAY_COLUMNS)
    for col in ("forecast_user_calls", "batch_quota", "batch_calls", "total", "capacity",
                "unplaceable", "overdue"):
        days_out[col] = days_out[col].astype("int64")
    days_out["planned"] = days_out["planned"].astype(bool)
    minutes_out = (pd.concat(minute_frames, ignore_index=True) if minute_frames else
                   pd.DataFrame({"org_code": pd.Series(dtype=str),
                                 "date": pd.Series(dtype=object),
                                 "minute": pd.Series(dtype="int64"),
                                 "target": pd.Series(dtype="int64")}))
    return WeekPlan(week_start=sunday, today=today, created_at=now, days=days_out,
                    minutes=minutes_out, limits=limits, load_generation=generation,
                    today_windows=today_windows)


async def save_plan(engine: AsyncEngine, plan: WeekPlan) -> None:
    """Replace plan_days and plan_minutes for the plan's planned days, in one transaction."""
    planned = plan.planned_days
    rows = plan.days[plan.days["planned"]]
    day_rows = [
        {"org_code": o, "day": d, "week_start": plan.week_start,
         "forecast_user_calls": int(f), "batch_quota": int(q), "capacity": int(c),
         "unplaceable": int(u), "created_at": plan.created_at, "overdue": int(od),
         "limits_key": str(k), "load_generation": plan.load_generation}
        for o, d, f, q, c, u, od, k in zip(
            rows["org_code"], rows["date"], rows["forecast_user_calls"], rows["batch_quota"],
            rows["capacity"], rows["unplaceable"], rows["overdue"], rows["limits_key"],
            strict=True)
    ]
    m = plan.minutes
    minute_rows = [(str(o), d, int(mi), int(t)) for o, d, mi, t in
                   zip(m["org_code"], m["date"], m["minute"], m["target"], strict=True)]
    async with transaction(engine) as conn:
        await conn.execute(delete(schema.plan_minutes)
                           .where(schema.plan_minutes.c.day.in_(planned)))
        await conn.execute(delete(schema.plan_days).where(schema.plan_days.c.day.in_(planned)))
        for i in range(0, len(day_rows), _INSERT_CHUNK):
            await conn.execute(insert(schema.plan_days), day_rows[i:i + _INSERT_CHUNK])
        if engine.dialect.name == "postgresql" and minute_rows:
            # Hundreds of thousands of minute rows: COPY, inside the same transaction.
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            await driver.copy_records_to_table(
                "plan_minutes", records=minute_rows,
                columns=["org_code", "day", "minute", "target"])
        else:
            keys = ("org_code", "day", "minute", "target")
            for i in range(0, len(minute_rows), _INSERT_CHUNK):
                await conn.execute(insert(schema.plan_minutes),
                                   [dict(zip(keys, r, strict=True))
                                    for r in minute_rows[i:i + _INSERT_CHUNK]])


async def load_day_plan(engine: AsyncEngine, *, day: date) -> dict[str, DayPlan]:
    """The saved plan of ``day`` per provider; {} when none was saved for that day."""
    pd_t = schema.plan_days
    pm = schema.plan_minutes
    async with connect(engine) as conn:
        days = (await conn.execute(select(pd_t.c.org_code, pd_t.c.batch_quota,
                                          pd_t.c.created_at, pd_t.c.limits_key,
                                          pd_t.c.load_generation, pd_t.c.overdue)
                                   .where(pd_t.c.day == day))).all()
        if not days:
            return {}
        mins = (await conn.execute(select(pm.c.org_code, pm.c.minute, pm.c.target)
                                   .where(pm.c.day == day)
                                   .order_by(pm.c.org_code, pm.c.minute))).all()
    by_org: dict[str, dict[int, int]] = {}
    for org, minute, target in mins:
        by_org.setdefault(str(org).strip(), {})[int(minute)] = int(target)
    return {str(o).strip(): DayPlan(str(o).strip(), day, int(q), by_org.get(str(o).strip(), {}),
                                    created_at=c, limits_key=k,
                                    load_generation=None if g is None else int(g),
                                    overdue=int(od))
            for o, q, c, k, g, od in days}


async def unplaceable_this_week(engine: AsyncEngine, *, week: date) -> dict[str, int]:
    """Consents the saved plan of ``week`` cannot place anywhere in it, per provider (only
    providers with some): they miss their week unless windows or limits change."""
    pd_t = schema.plan_days
    async with connect(engine) as conn:
        rows = (await conn.execute(
            select(pd_t.c.org_code, func.sum(pd_t.c.unplaceable))
            .where(pd_t.c.week_start == week).group_by(pd_t.c.org_code))).all()
    return {str(o).strip(): int(n) for o, n in rows if n}


async def stale_reasons(engine: AsyncEngine, plans: dict[str, DayPlan],
                        limits: dict[str, ProviderLimits], *, now: datetime,
                        today_windows: tuple[Window, ...] | None = None) -> tuple[str, ...]:
    """Why the saved plan of a day must be re-made before it is run ("" reasons: it may be
    run as it is): none saved, saved before that day, consents or institutions loaded again
    since, a provider's limits (or ``today_windows``) not those it was made under, or a
    provider it does not cover. A plan saved by an older version (no record of what it was
    made from) is judged by its date alone."""
    today = now.astimezone(KST).date()
    if not plans:  # (a plan saved for another day, e.g. last Saturday's, is not today's)
        return (f"no plan saved for today, {today:%a %Y-%m-%d}",)
    reasons: list[str] = []
    day_start = datetime.combine(today, time(0), KST)
    if any(p.created_at is None or p.created_at < day_start for p in plans.values()):
        reasons.append("plan saved before today")
    gens = [p.load_generation for p in plans.values() if p.load_generation is not None]
    if gens:
        async with connect(engine) as conn:
            again = await loaded_since(conn, min(gens))
        reasons += [f"{what} loaded again since the plan was made" for what in again]
    for org, lim in sorted(limits.items()):
        plan = plans.get(org)
        want = lim.with_windows(today_windows).key
        if plan is None:
            reasons.append(f"no plan for {org}")
        elif plan.limits_key is not None and plan.limits_key != want:
            reasons.append(f"{org} planned under {plan.limits_key}, now {want}")
    return tuple(reasons)
