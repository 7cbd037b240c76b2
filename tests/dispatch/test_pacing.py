from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batch.dispatch.pacing import minute_target, percentile, slice_counts, slice_offset


@given(st.integers(min_value=0, max_value=100_000))
def test_slices_add_up_exactly_and_never_burst(n: int) -> None:
    counts = slice_counts(n)
    assert len(counts) == 600
    assert sum(counts) == n
    assert max(counts) - min(counts) <= 1


@given(st.integers(min_value=0, max_value=100_000), st.integers(1, 600),
       st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_a_phase_moves_the_starts_never_their_count(n: int, slices: int, phase: float) -> None:
    counts = slice_counts(n, slices, phase)
    assert len(counts) == slices
    assert sum(counts) == n
    assert max(counts) - min(counts) <= 1


def test_providers_at_phases_i_over_n_start_in_every_slice_evenly() -> None:
    # 300 providers at 2 refreshes/s: one slice in five each; by phase, 60 in every slice.
    firsts = Counter(slice_counts(120, 600, i / 300).index(1) % 5 for i in range(300))
    assert sorted(firsts.values()) == [60] * 5
    # without a phase, all 300 would start in the same slices
    assert slice_counts(120, 600, 0.0).index(1) == 4


def test_offsets_keep_apart_the_ticks_of_providers_that_share_slices() -> None:
    # 300 providers at 2 refreshes/s, the i-th at phase i/300 and offset slice_offset(i):
    # over the five slices' period (500 ms) no two ticks closer than 0.8 ms (evenly spaced
    # would be 1.67 ms); a hash of the org code put 433 of 3,000 gaps under 0.3 ms.
    ticks = sorted((slice_counts(120, 600, i / 300).index(1) % 5 + slice_offset(i)) * 100
                   for i in range(300))
    gaps = [b - a for a, b in itertools.pairwise(ticks)] + [ticks[0] + 500 - ticks[-1]]
    assert min(gaps) > 0.8
    # any run of consecutive providers is spread over the whole slice
    for start in (0, 17, 240):
        offs = sorted(slice_offset(i) for i in range(start, start + 60))
        assert max(b - a for a, b in itertools.pairwise(offs)) < 3 / 60
    assert all(0.0 <= slice_offset(i) < 1.0 for i in range(10_000))
    with pytest.raises(ValueError, match="index"):
        slice_offset(-1)


def test_a_minute_of_1000_starts_one_or_two_per_slice_in_order() -> None:
    counts = slice_counts(1000)
    assert set(counts) == {1, 2}
    assert counts[:3] == [1, 2, 2]


def test_shortfall_is_re_spread_over_the_remaining_minutes() -> None:
    planned = {0: 100, 1: 100, 2: 100, 3: 100}
    # On plan: 400 left over 4 minutes -> 100.
    assert minute_target(0, [0, 1, 2, 3], planned, 400, cap=1000) == 100
    # Minute 0 fell 60 short: 360 left over 3 minutes -> 120 each.
    assert minute_target(1, [1, 2, 3], planned, 360, cap=1000) == 120
    # The cap still holds.
    assert minute_target(1, [1, 2, 3], planned, 360, cap=110) == 110
    # The last minute takes everything that is left (up to the cap).
    assert minute_target(3, [3], planned, 7, cap=1000) == 7


def test_minutes_without_a_plan_share_evenly() -> None:
    assert minute_target(5, [5, 6], {}, 10, cap=100) == 5


@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.integers(0, 2000))
def test_following_the_targets_spends_the_quota_exactly_when_the_cap_allows(
    plan: list[int], quota: int,
) -> None:
    minutes = list(range(len(plan)))
    planned = dict(enumerate(plan))
    cap = 10_000
    left = quota
    for i, m in enumerate(minutes):
        n = minute_target(m, minutes[i:], planned, left, cap)
        assert 0 <= n <= left
        left -= n
    assert left == 0


def test_percentile_nearest_rank() -> None:
    assert percentile([], 99) == 0.0
    values = sorted(float(i) for i in range(1, 101))
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
