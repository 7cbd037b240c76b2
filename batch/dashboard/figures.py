"""The numbers the dashboard derives from a snapshot: totals, flatness, progress, the JSON.

Pure functions over :class:`~batch.dashboard.data.Snapshot`; no I/O, no clock. Load and
flatness are in API calls (user calls + batch consents x calls per consent), as the
planner levels them; plan-vs-done progress is in consents, as the dispatcher counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from enum import StrEnum
from typing import Any

import pandas as pd

from batch.dashboard.data import DayLoad, Snapshot

ALL = "ALL"
#: A provider is behind plan when it trails the minute plan by more than this share of
#: its day's quota (at least one refresh): refreshes in flight must not raise the alarm.
BEHIND_TOLERANCE = 0.02


def peak_to_mean(values: Sequence[int | float]) -> float | None:
    """max / mean of the daily loads; 1.0 is perfectly flat; None when there is no load."""
    if not values:
        return None
    mean = sum(values) / len(values)
    if mean <= 0:
        return None
    return max(values) / mean


def _sum_opt(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def day_loads(snap: Snapshot, org_code: str = ALL) -> list[DayLoad]:
    """The seven days of one provider, or of all providers summed (``ALL``)."""
    orgs = snap.providers if org_code == ALL else (org_code,)
    out = []
    for day in snap.days:
        cells = [snap.load(org, day) for org in orgs]
        out.append(DayLoad(
            org_code=org_code, day=day,
            forecast_user_calls=_sum_opt([c.forecast_user_calls for c in cells]),
            # best known: actuals where a provider has them, its forecast where not
            actual_user_calls=sum(c.user_calls for c in cells)
            if any(c.actual_user_calls is not None for c in cells) else None,
            batch_quota=_sum_opt([c.batch_quota for c in cells]),
            batch_done=sum(c.batch_done for c in cells),
            capacity=_sum_opt([c.capacity for c in cells]),
            unplaceable=sum(c.unplaceable for c in cells),
            batch_planned_calls=_sum_opt([c.batch_planned_calls for c in cells]),
            batch_calls_made=sum(c.batch_calls_made for c in cells),
            ran=any(c.ran for c in cells), overdue=sum(c.overdue for c in cells),
        ))
    return out


@dataclass(frozen=True, slots=True)
class Flatness:
    """How flat one provider's week is in calls: the peak-to-mean of user + planned batch
    calls, against the same batch calls split 1/7 a day."""

    org_code: str
    planned: float | None
    uniform: float | None
    peak_day: date | None

    @property
    def improvement(self) -> float | None:
        """How much lower the plan's peak is than the uniform split's (0.1 = 10 %)."""
        if self.planned is None or self.uniform is None or self.uniform == 0:
            return None
        return 1 - self.planned / self.uniform


def flatness(loads: Sequence[DayLoad]) -> Flatness:
    org = loads[0].org_code if loads else ALL
    totals = [x.total_planned_calls for x in loads]
    batch = sum(x.planned_calls for x in loads)
    uniform = [x.user_calls + batch / len(loads) for x in loads] if loads else []
    peak = max(loads, key=lambda x: x.total_planned_calls).day if any(totals) else None
    return Flatness(org, peak_to_mean(totals), peak_to_mean(uniform), peak)


class Status(StrEnum):
    COMPLETE = "complete"
    ON_TRACK = "on track"
    IN_PROGRESS = "in progress"
    BEHIND = "behind plan"
    NOT_STARTED = "not started"
    NO_PLAN = "no plan"


@dataclass(frozen=True, slots=True)
class Progress:
    """Planned vs done consents for one provider on the focus day."""

    org_code: str
    planned: int
    done: int
    expected: int | None
    status: Status

    @property
    def share(self) -> float | None:
        return self.done / self.planned if self.planned else None


def progress(snap: Snapshot) -> list[Progress]:
    """Per provider, the focus day's plan against what is done, with its status."""
    expected = dict(snap.expected_by_now)
    out = []
    for org in snap.providers:
        load = snap.load(org, snap.focus_day)
        exp = expected.get(org)
        out.append(Progress(org, load.planned_consents, load.batch_done, exp,
                            _status(load, exp, snap.focus_day, snap.today)))
    return out


def _status(load: DayLoad, expected: int | None, day: date, today: date) -> Status:
    if load.batch_quota is None:
        return Status.NO_PLAN
    if load.batch_done >= load.planned_consents:
        return Status.COMPLETE
    if day < today:
        return Status.BEHIND
    if day > today:
        return Status.NOT_STARTED
    if expected is None:
        return Status.IN_PROGRESS
    slack = max(1.0, BEHIND_TOLERANCE * load.planned_consents)
    return Status.BEHIND if expected - load.batch_done > slack else Status.ON_TRACK


#: the per-day keys of the JSON and the frame; the suffix says the unit
DAY_KEYS = ("forecast_user_calls", "actual_user_calls", "user_calls",
            "batch_planned_consents", "batch_planned_calls", "batch_done_consents",
            "batch_actual_calls", "user_plus_batch_planned_calls",
            "user_plus_batch_actual_calls", "unplaceable_consents")


def day_record(x: DayLoad) -> dict[str, int | None]:
    """One day's numbers under unit-named keys (``*_calls`` or ``*_consents``)."""
    return {"forecast_user_calls": x.forecast_user_calls,
            "actual_user_calls": x.actual_user_calls, "user_calls": x.user_calls,
            "batch_planned_consents": x.batch_quota,
            "batch_planned_calls": x.batch_planned_calls,
            "batch_done_consents": x.batch_done,
            "batch_actual_calls": x.batch_calls_made if x.ran else None,
            "user_plus_batch_planned_calls": x.total_planned_calls,
            "user_plus_batch_actual_calls": x.total_actual_calls,
            "unplaceable_consents": x.unplaceable}


def load_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per provider and day, with the derived user, total and done columns."""
    rows = [{"org_code": org, "day": x.day, **day_record(x)}
            for org in snap.providers for x in day_loads(snap, org)]
    return pd.DataFrame(rows, columns=["org_code", "day", *DAY_KEYS])


def _iso(value: date | datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summary(snap: Snapshot) -> dict[str, Any]:
    """The JSON document served at ``/api/summary.json`` (plain types only)."""
    def day_rows(org: str) -> list[dict[str, Any]]:
        return [{"date": x.day.isoformat(), **day_record(x)} for x in day_loads(snap, org)]

    def flat(org: str) -> dict[str, Any]:
        f = flatness(day_loads(snap, org))
        return {"peak_to_mean_calls": _round(f.planned),
                "uniform_peak_to_mean_calls": _round(f.uniform),
                "peak_day": _iso(f.peak_day)}

    return {
        "week_start": snap.week_start.isoformat(),
        "today": snap.today.isoformat(),
        "focus_day": snap.focus_day.isoformat(),
        "generated_at": snap.generated_at.isoformat(),
        "has_plan": snap.has_plan,
        "config_errors": list(snap.config_errors),
        "providers": [
            {"org_code": org, "calls_per_consent": snap.cpc(org), "days": day_rows(org),
             "overdue_consents": snap.overdue(org), **flat(org)} for org in snap.providers
        ],
        "total": {"days": day_rows(ALL), **flat(ALL)},
        "progress": [
            {"org_code": p.org_code, "planned_consents": p.planned,
             "done_consents": p.done, "expected_by_now_consents": p.expected,
             "status": str(p.status)}
            for p in progress(snap)
        ],
        "runs": [
            {"run_id": r.run_id, "date": r.day.isoformat(), "worker_id": r.worker_id,
             "started_at": _iso(r.started_at), "finished_at": _iso(r.finished_at),
             "status": r.status, "error": r.error,
             "totals": None if r.totals is None else {
                 "planned": r.totals.planned, "attempted": r.totals.attempted,
                 "succeeded": r.totals.succeeded, "failed": r.totals.failed,
                 "deferred": r.totals.deferred, "no_longer_due": r.totals.no_longer_due,
                 "dead_lettered": r.totals.dead_lettered}}
            for r in snap.runs
        ],
        "outcomes": [
            {"org_code": o.org_code, "kind": o.kind, "action": o.action,
             "refreshes": o.count, "calls": o.calls}
            for o in snap.outcomes
        ],
        "dead_letters_open": [
            {"org_code": g.org_code, "count": g.count, "oldest": _iso(g.oldest)}
            for g in snap.dead_letter_groups
        ],
        "unplaceable": [
            {"org_code": x.org_code, "date": x.day.isoformat(),
             "unplaceable_consents": x.unplaceable}
            for x in snap.loads if x.unplaceable > 0
        ],
    }
