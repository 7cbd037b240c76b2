"""The Sunday-to-Saturday week in KST and each consent's due week."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from planning.calendar import kst_date, next_due_week, week_days, week_start


def test_the_week_starts_on_sunday() -> None:
    assert week_start(date(2026, 11, 22)) == date(2026, 11, 22)      # a Sunday
    assert week_start(date(2026, 11, 28)) == date(2026, 11, 22)      # its Saturday
    assert week_start(date(2026, 11, 29)) == date(2026, 11, 29)
    days = week_days(date(2026, 11, 25))
    assert days[0] == date(2026, 11, 22) and days[-1] == date(2026, 11, 28)
    assert len(days) == 7


def test_kst_date_is_nine_hours_ahead_of_utc() -> None:
    assert kst_date(datetime(2026, 11, 21, 15, 0, tzinfo=UTC)) == date(2026, 11, 22)
    assert kst_date(datetime(2026, 11, 21, 14, 59, tzinfo=UTC)) == date(2026, 11, 21)
    with pytest.raises(ValueError, match="aware"):
        kst_date(datetime(2026, 11, 21, 15, 0))


def test_a_consent_is_due_the_week_after_its_last_transfer_in_kst() -> None:
    # Saturday 23:30 KST is still last week; Sunday 00:30 KST (Saturday in UTC) is this week.
    sat_late = datetime(2026, 11, 28, 14, 30, tzinfo=UTC)            # Sat 23:30 KST
    sun_early = datetime(2026, 11, 28, 15, 30, tzinfo=UTC)           # Sun 00:30 KST
    consented = datetime(2026, 1, 1, tzinfo=UTC)
    assert next_due_week(sat_late, consented) == date(2026, 11, 29)
    assert next_due_week(sun_early, consented) == date(2026, 12, 6)


def test_a_never_fetched_consent_is_due_in_the_week_of_its_consent() -> None:
    assert next_due_week(None, datetime(2026, 11, 25, 3, tzinfo=UTC)) == date(2026, 11, 22)
