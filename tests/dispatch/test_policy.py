"""RetryPolicy: backoff, and never past the week's last open window minute."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from batch.clock import KST
from batch.dispatch.policy import RetryPolicy
from planning.windows import parse_windows

WEEK = date(2026, 11, 29)  # a Sunday
SATURDAY = date(2026, 12, 5)


def test_backoff_doubles_up_to_the_cap() -> None:
    p = RetryPolicy(base_delay=timedelta(minutes=10), max_delay=timedelta(minutes=30))
    assert [p.delay(n) for n in (1, 2, 3, 4)] == [timedelta(minutes=m) for m in (10, 20, 30, 30)]


def test_a_retry_delay_never_pushes_a_consent_past_the_last_window_of_its_week() -> None:
    p = RetryPolicy(windows=parse_windows(["1700:2300"]))
    now = datetime.combine(SATURDAY, datetime.min.time(), KST) + timedelta(hours=22)
    at = p.retry_at(now, timedelta(hours=6), week=WEEK)
    assert at == datetime(2026, 12, 5, 22, 59, tzinfo=KST)
    # Earlier in the week the delay is the delay.
    tuesday = datetime(2026, 12, 1, 18, 0, tzinfo=KST)
    assert p.retry_at(tuesday, timedelta(hours=6), week=WEEK) == tuesday + timedelta(hours=6)


def test_past_the_last_window_the_delay_is_left_alone() -> None:
    p = RetryPolicy(windows=parse_windows(["1700:2300"]))
    late = datetime(2026, 12, 5, 23, 30, tzinfo=KST)
    assert p.retry_at(late, timedelta(hours=1), week=WEEK) == late + timedelta(hours=1)


def test_a_window_past_saturday_midnight_ends_the_week_at_2359() -> None:
    p = RetryPolicy(windows=parse_windows(["2000:0300"]))
    assert p.last_open_minute(WEEK) == datetime(2026, 12, 5, 23, 59, tzinfo=KST)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
