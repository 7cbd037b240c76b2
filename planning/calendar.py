"""The scheduled-transfer week: Sunday to Saturday in KST."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

KST = timezone(timedelta(hours=9), "KST")


def week_start(day: date) -> date:
    """The Sunday that starts the week holding ``day``."""
    # date.weekday(): Monday=0 ... Sunday=6
    return day - timedelta(days=(day.weekday() + 1) % 7)


def week_days(day: date) -> list[date]:
    """The seven dates, Sunday first, of the week holding ``day``."""
    start = week_start(day)
    return [start + timedelta(days=i) for i in range(7)]


def kst_date(when: datetime) -> date:
    """The KST calendar date of an aware timestamp."""
    if when.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware")
    return when.astimezone(KST).date()


def next_due_week(last_scheduled_at: datetime | None, consented_at: datetime) -> date:
    """The week start in which a consent is next due.

    Never fetched: the week of its consent. Fetched: the week after the last transfer.
    """
    if last_scheduled_at is None:
        return week_start(kst_date(consented_at))
    return week_start(kst_date(last_scheduled_at)) + timedelta(days=7)
