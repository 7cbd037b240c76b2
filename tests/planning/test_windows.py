"""Provider windows: midnight, three windows, 30-minute steps, and bad strings."""

from __future__ import annotations

import pytest

from planning.windows import (
    Window,
    WindowError,
    day_minutes,
    in_windows,
    parse_window,
    parse_windows,
)


def test_a_window_past_midnight_covers_both_ends_of_the_day() -> None:
    w = parse_window("2300:0500")
    assert w.crosses_midnight
    assert w.length == 360
    assert w.contains(23 * 60) and w.contains(0) and w.contains(299)
    assert not w.contains(300) and not w.contains(22 * 60 + 59)
    assert w.minutes()[:2] == [0, 1] and w.minutes()[-1] == 1439


def test_2400_is_the_end_of_the_day() -> None:
    w = parse_window("1800:2400")
    assert (w.start, w.end) == (1080, 1440)
    assert not w.crosses_midnight
    assert len(w.minutes()) == 360


def test_three_windows_union_their_minutes() -> None:
    ws = parse_windows(["0000:0200", "0300:0500", "2200:2400"])
    mins = day_minutes(ws)
    assert len(mins) == 360
    assert in_windows(ws, 0) and in_windows(ws, 1439) and not in_windows(ws, 150)


def test_a_fourth_window_is_refused() -> None:
    with pytest.raises(WindowError, match="at most 3"):
        parse_windows(["0000:0200", "0300:0500", "0600:0800", "2200:2400"])


def test_windows_shorter_than_six_hours_in_total_are_refused() -> None:
    with pytest.raises(WindowError, match="at least 360"):
        parse_windows(["0000:0200"])
    assert len(day_minutes(parse_windows(["0000:0200"], min_total_minutes=0))) == 120


def test_overlapping_windows_are_merged_and_counted_once_even_across_midnight() -> None:
    # DESIGN.md's own example: 23:00-01:00 overlaps 00:30-05:30.
    mins = day_minutes(parse_windows(["0030:0530", "2300:0100"]))
    assert mins == list(range(0, 330)) + list(range(1380, 1440))
    with pytest.raises(WindowError, match="at least 360"):
        parse_windows(["2300:0200", "0000:0200"])  # 180 minutes, not 300


@pytest.mark.parametrize("text, match", [
    ("0030-0530", "hhmm:hhmm"),
    ("30:0530", "hhmm:hhmm"),
    ("", "hhmm:hhmm"),
    ("0060:0130", "not a time of day"),
    ("2500:0100", "not a time of day"),
    ("2400:0100", "start 2400"),
    ("0015:0530", "30-minute steps"),
    ("0100:0100", "equal"),
])
def test_bad_window_strings_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(WindowError, match=match):
        parse_window(text)


def test_0000_2400_is_the_whole_day_not_equal_ends() -> None:
    w = parse_window("0000:2400")
    assert (w.start, w.end, w.length, w.crosses_midnight) == (0, 1440, 1440, False)
    assert len(w.minutes()) == 1440


def test_override_windows_may_use_any_minute() -> None:
    w = parse_window("0007:0013", step=1)
    assert w.minutes() == list(range(7, 13))


def test_a_single_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(WindowError, match="list"):
        parse_windows("0000:0600")  # type: ignore[arg-type]


def test_window_bounds_are_validated() -> None:
    with pytest.raises(WindowError):
        Window(1440, 10)
