"""When a consent can first be placed: by window time, not by calendar day.

A consent may be fetched from ``not_before`` on. It is released onto the first planned day
that still has a window minute starting at or after ``not_before``: a consent due again at
10:00 on a day whose window closed at 06:00 goes onto the next day, and one due after the
week's last window minute cannot be placed this week at all. Pure: times are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta

from planning.calendar import KST, kst_date
from planning.windows import Window, day_minutes


def usable_minutes(windows: Sequence[Window], day: date, now: datetime) -> list[int]:
    """Minutes of ``day`` still usable at ``now`` (aware): all of a later day, those
    starting at or after ``now`` today, none of a day already past."""
    today = kst_date(now)
    if day < today:
        return []
    mins = day_minutes(windows)
    if day == today:
        local = now.astimezone(KST)
        seconds = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
        first = math.ceil(seconds / 60)
        mins = [m for m in mins if m >= first]
    return mins


def last_starts(days: Sequence[date], minutes: Sequence[Sequence[int]]
                ) -> list[datetime | None]:
    """The start (KST) of each day's last usable minute; None for a day with none."""
    if len(days) != len(minutes):
        raise ValueError("one list of minutes per day is required")
    return [datetime.combine(d, time(0), KST) + timedelta(minutes=max(m)) if m else None
            for d, m in zip(days, minutes, strict=True)]


def release_index(not_before: datetime, bounds: Sequence[datetime | None]) -> int | None:
    """The first day whose last usable minute starts at or after ``not_before``; None when
    no day of the week has one (the consent cannot be placed this week)."""
    if not_before.tzinfo is None:
        raise ValueError("not_before must be timezone-aware")
    for i, bound in enumerate(bounds):
        if bound is not None and not_before <= bound:
            return i
    return None
