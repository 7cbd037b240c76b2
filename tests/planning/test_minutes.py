"""The minute plan: exact sums, the per-minute cap, even spread, lower where users are busy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.minutes import hourly_weights, minute_caps, spread
from planning.windows import day_minutes, parse_windows


@settings(max_examples=100, deadline=None)
@given(quota=st.integers(0, 20_000), start=st.integers(0, 1439), length=st.integers(0, 400),
       cap=st.integers(0, 60), weighted=st.booleans(), data=st.data())
def test_spread_sums_exactly_and_respects_the_cap(quota: int, start: int, length: int,
                                                   cap: int, weighted: bool,
                                                   data: st.DataObject) -> None:
    minutes = [(start + i) % 1440 for i in range(min(length, 1440))]
    weights = None
    if weighted:
        weights = data.draw(st.lists(st.floats(0, 1e6), min_size=len(minutes),
                                     max_size=len(minutes)))
    s = spread(quota, minutes, cap, weights)
    assert int(s.sum()) == min(quota, cap * len(minutes))
    assert list(s.index) == minutes
    assert (s >= 0).all() and (s <= cap).all()


@settings(max_examples=100, deadline=None)
@given(quota=st.integers(0, 20_000), caps=st.lists(st.integers(0, 60), max_size=300),
       weighted=st.booleans(), data=st.data())
def test_spread_respects_each_minutes_own_cap(quota: int, caps: list[int], weighted: bool,
                                              data: st.DataObject) -> None:
    minutes = list(range(100, 100 + len(caps)))
    weights = None
    if weighted:
        weights = data.draw(st.lists(st.floats(0, 1e6), min_size=len(caps),
                                     max_size=len(caps)))
    s = spread(quota, minutes, caps, weights)
    assert int(s.sum()) == min(quota, sum(caps))
    assert all(0 <= t <= c for t, c in zip(s.tolist(), caps, strict=True))


def test_tiny_weights_spread_like_any_other_scale() -> None:
    # a subnormal user load made 1 / (weight + mean) infinite and the plan garbage
    tiny = spread(7, [100, 101, 102], 5, [2.2e-311, 0.0, 4.4e-311])
    assert tiny.tolist() == spread(7, [100, 101, 102], 5, [2.0, 0.0, 4.0]).tolist()
    assert int(spread(1, [100], [1], [2.2e-311]).sum()) == 1


def test_the_last_minute_of_each_segment_holds_only_what_starts_before_its_margin() -> None:
    # 01:00-01:02 and 23:58-23:59 (the day's run ends at midnight): 1,400 a minute, the
    # segments' last minutes (01:02, 23:59) 1,166 = what 50 s hold
    mins = [60, 61, 62, 1438, 1439]
    assert minute_caps(mins, 1400) == [1400, 1400, 1166, 1400, 1166]
    assert minute_caps(mins, 1400, finish_margin=0) == [1400] * 5
    assert minute_caps([0, 5], 1) == [1, 1]       # one a minute is no rate to squeeze
    assert minute_caps([0], 0) == [0]
    # at the cap the plan fills the short minutes only to their own cap
    s = spread(10_000, mins, minute_caps(mins, 1400))
    assert s.tolist() == [1400, 1400, 1166, 1400, 1166]
    with pytest.raises(ValueError, match="finish_margin"):
        minute_caps(mins, 10, finish_margin=60)
    with pytest.raises(ValueError, match="caps given"):
        spread(5, [0, 1], [5])


def test_even_spread_differs_by_at_most_one_and_spreads_the_remainder() -> None:
    mins = list(range(30, 330))                      # 300 minutes
    s = spread(450, mins, 10)
    assert set(s.unique()) == {1, 2}
    assert int(s.sum()) == 450
    # the 150 extra units are spread along the window, not bunched at its start
    first_half = int(s.iloc[:150].sum())
    assert abs(first_half - 225) <= 3


def test_a_window_past_midnight_is_indexed_by_minute_of_day() -> None:
    mins = day_minutes(parse_windows(["2300:0100"], min_total_minutes=0))
    s = spread(120, mins, 5)
    assert s.index.min() == 0 and s.index.max() == 1439
    assert (s == 1).all()
    assert s.index.name == "minute"


def test_quota_above_capacity_fills_every_minute_to_the_cap() -> None:
    s = spread(1000, [1, 2, 3], 7)
    assert s.tolist() == [7, 7, 7]


def test_busier_minutes_get_less_batch() -> None:
    mins = list(range(0, 120))
    weights = hourly_weights(mins, {0: 10.0, 1: 100.0})
    s = spread(1200, mins, 1000, weights)
    assert int(s.sum()) == 1200
    assert s.iloc[:60].sum() > 2 * s.iloc[60:].sum()
    assert s.iloc[0] > s.iloc[90] > 0


def test_capped_minutes_pass_their_excess_to_the_others() -> None:
    s = spread(30, [0, 1, 2], 12, weights=[0.0, 100.0, 100.0])
    assert s.tolist()[0] == 12
    assert int(s.sum()) == 30


@pytest.mark.parametrize("args, match", [
    ((-1, [0], 1), "quota"),
    ((1, [0], -1), "per_minute_cap"),
    ((1, [1440], 1), "0..1439"),
    ((1, [3, 3], 1), "repeat"),
])
def test_bad_arguments_are_refused(args: tuple[int, list[int], int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        spread(*args)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weights"):
        spread(5, [0, 1], 5, weights=[1.0])
    with pytest.raises(ValueError, match="finite"):
        spread(5, [0, 1], 5, weights=[1.0, -2.0])
