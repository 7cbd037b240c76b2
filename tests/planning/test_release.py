"""Release by window time: the first day with a window minute at or after not_before."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from planning.calendar import KST
from planning.release import last_starts, release_index, usable_minutes
from planning.windows import parse_windows

MONDAY = date(2026, 11, 30)
DAYS = [MONDAY + timedelta(i) for i in range(6)]          # Monday .. Saturday
EARLY = parse_windows(["0000:0600"])


def _bounds(now: datetime) -> list[datetime | None]:
    return last_starts(DAYS, [usable_minutes(EARLY, d, now) for d in DAYS])


def test_a_consent_due_at_ten_goes_onto_the_next_day_when_the_window_closed_at_six() -> None:
    b = _bounds(datetime(2026, 11, 30, 0, 5, tzinfo=KST))
    assert release_index(datetime(2026, 11, 30, 10, 0, tzinfo=KST), b) == 1
    assert release_index(datetime(2026, 11, 30, 5, 59, tzinfo=KST), b) == 0
    assert release_index(datetime(2026, 11, 30, 5, 59, 1, tzinfo=KST), b) == 1


def test_after_the_weeks_last_window_minute_nothing_can_take_it() -> None:
    b = _bounds(datetime(2026, 11, 30, 0, 5, tzinfo=KST))
    assert release_index(datetime(2026, 12, 5, 10, 0, tzinfo=KST), b) is None


def test_a_day_whose_window_is_over_releases_nothing() -> None:
    b = _bounds(datetime(2026, 11, 30, 7, 0, tzinfo=KST))
    assert b[0] is None
    assert release_index(datetime(2026, 11, 1, tzinfo=KST), b) == 1


@given(st.integers(0, 6 * 24 * 60 - 1))
def test_the_released_day_has_a_window_minute_at_or_after_not_before(offset: int) -> None:
    now = datetime(2026, 11, 30, 0, 0, tzinfo=KST)
    nb = now + timedelta(minutes=offset)
    b = _bounds(now)
    i = release_index(nb, b)
    if i is None:
        assert all(x is None or x < nb for x in b)
    else:
        start = datetime(DAYS[i].year, DAYS[i].month, DAYS[i].day, tzinfo=KST)
        assert any(start + timedelta(minutes=m) >= nb
                   for m in usable_minutes(EARLY, DAYS[i], now))
        assert all(x is None or x < nb for x in b[:i])
