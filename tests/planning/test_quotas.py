"""Daily quotas: exact least peak, then flattest; deadlines, releases and capacity hold."""

from __future__ import annotations

import itertools
from datetime import date, timedelta

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.quotas import (
    ConsentClass,
    deadline_misses,
    edf_assign,
    level,
    lower_bound,
    plan_quotas,
)


def _assignable(x: tuple[int, ...], classes: list[ConsentClass]) -> bool:
    days = len(x)
    for s in range(days):
        for t in range(s, days):
            need = sum(k.count for k in classes if k.release >= s and k.deadline <= t)
            if need > sum(x[s:t + 1]):
                return False
    return True


def brute_force(base: list[float], cap: list[int], classes: list[ConsentClass],
                w: float) -> tuple[float, float]:
    """(least peak, least sum of squares at that peak) over every integer plan."""
    n = sum(k.count for k in classes)
    best: tuple[float, float] | None = None
    for x in itertools.product(*(range(c + 1) for c in cap)):
        if sum(x) != n or not _assignable(x, classes):
            continue
        tot = [b + w * q for b, q in zip(base, x, strict=True)]
        key = (round(max(tot), 9), round(sum(v * v for v in tot), 6))
        if best is None or key < best:
            best = key
    assert best is not None
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[float], list[int], list[ConsentClass], float]:
    days = draw(st.integers(1, 5))
    base = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0, 7.0]),
                         min_size=days, max_size=days))
    cap = draw(st.lists(st.integers(0, 4), min_size=days, max_size=days))
    classes = []
    for _ in range(draw(st.integers(0, 3))):
        r = draw(st.integers(0, days - 1))
        e = draw(st.integers(r, days - 1))
        classes.append(ConsentClass(r, e, draw(st.integers(0, 4))))
    w = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    return base, cap, classes, w


@settings(max_examples=200, deadline=None)
@given(instances())
def test_peak_and_flatness_equal_the_brute_force_optimum(
        inst: tuple[list[float], list[int], list[ConsentClass], float]) -> None:
    base, cap, classes, w = inst
    res = level(base, cap, classes, weight=w)
    placeable = [ConsentClass(k.release, k.deadline, k.count - u)
                 for k, u in zip(classes, res.unplaceable, strict=True)]
    peak, squares = brute_force(base, cap, placeable, w)
    tot = [b + w * q for b, q in zip(base, res.quotas, strict=True)]
    assert res.peak == pytest.approx(peak, abs=1e-9)
    assert sum(v * v for v in tot) == pytest.approx(squares, abs=1e-6)
    assert lower_bound(base, cap, classes, weight=w) <= res.peak + 1e-9


@settings(max_examples=200, deadline=None)
@given(instances())
def test_quotas_add_up_and_every_consent_sits_inside_its_release_and_deadline(
        inst: tuple[list[float], list[int], list[ConsentClass], float]) -> None:
    base, cap, classes, w = inst
    res = level(base, cap, classes, weight=w)
    due = sum(k.count for k in classes)
    assert sum(res.quotas) == due - res.total_unplaceable
    assert all(0 <= q <= c for q, c in zip(res.quotas, cap, strict=True))
    for k, row, left in zip(classes, res.assignment, res.unplaceable, strict=True):
        assert sum(row) + left == k.count
        assert all(n == 0 for d, n in enumerate(row) if d < k.release or d > k.deadline)
    assert [sum(col) for col in zip(*res.assignment, strict=True)] == list(res.quotas) \
        or not classes


@settings(max_examples=100, deadline=None)
@given(instances())
def test_unplaceable_is_the_least_any_plan_can_leave(
        inst: tuple[list[float], list[int], list[ConsentClass], float]) -> None:
    base, cap, classes, w = inst
    res = level(base, cap, classes, weight=w)
    # brute force: the most consents any capacity-respecting plan can place
    best = 0
    for x in itertools.product(*(range(c + 1) for c in cap)):
        best = max(best, sum(k.count for k in classes) - deadline_misses(x, classes))
    assert sum(res.quotas) == best


def test_backlog_due_on_day_one_goes_on_day_one_even_when_that_day_is_busy() -> None:
    res = level([100.0, 0, 0, 0, 0, 0, 0], [1000] * 7,
                [ConsentClass(0, 0, 30), ConsentClass(0, 6, 70)])
    assert res.quotas[0] == 30
    assert sum(res.quotas) == 100
    assert res.assignment[0] == (30, 0, 0, 0, 0, 0, 0)


def test_nothing_goes_before_its_release_day() -> None:
    res = level([0.0] * 7, [1000] * 7, [ConsentClass(4, 6, 90)])
    assert res.quotas == (0, 0, 0, 0, 30, 30, 30)


def test_a_payday_peak_gets_less_batch_and_the_week_is_level_around_it() -> None:
    base = [100.0, 100, 100, 400, 100, 100, 100]
    res = level(base, [10_000] * 7, [ConsentClass(0, 6, 600)])
    assert res.quotas[3] == 0
    assert res.peak == 400.0
    assert res.quotas == (100, 100, 100, 0, 100, 100, 100)
    res = level(base, [10_000] * 7, [ConsentClass(0, 6, 3000)])
    assert res.peak == pytest.approx((sum(base) + 3000) / 7, abs=1)
    assert max(res.quotas) - min(res.quotas) <= 301


def test_capacity_shortfall_is_counted_not_dropped() -> None:
    res = level([0.0] * 3, [5, 5, 5], [ConsentClass(0, 0, 8), ConsentClass(0, 2, 4)])
    assert res.unplaceable == (3, 0)
    assert res.quotas == (5, 2, 2)


def test_weight_turns_consents_into_calls() -> None:
    res = level([0.0, 30.0], [100, 100], [ConsentClass(0, 1, 20)], weight=3.0)
    assert res.quotas == (15, 5)
    assert res.peak == 45.0


def test_large_counts_are_levelled_in_bulk_not_one_by_one() -> None:
    base = [1e6, 2e6, 1.5e6, 1e6, 3e6, 1e6, 0.5e6]
    res = level(base, [10**7] * 7, [ConsentClass(0, 0, 10**5), ConsentClass(0, 6, 5 * 10**6)],
                weight=2.5)
    assert sum(res.quotas) == 5_100_000
    assert res.peak / lower_bound(base, [10**7] * 7, [ConsentClass(0, 0, 10**5),
                                                      ConsentClass(0, 6, 5 * 10**6)],
                                  weight=2.5) < 1 + 1e-6


def test_invalid_inputs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="before release"):
        ConsentClass(3, 2, 1)
    with pytest.raises(ValueError, match="beyond the last day"):
        level([0.0, 0.0], [1, 1], [ConsentClass(0, 2, 1)])
    with pytest.raises(ValueError, match="same length"):
        level([0.0, 0.0], [1], [])
    with pytest.raises(ValueError, match="weight"):
        level([0.0], [1], [], weight=0)


def test_edf_places_earliest_deadlines_first() -> None:
    out, left = edf_assign([1, 1], [ConsentClass(0, 1, 1), ConsentClass(0, 0, 1)])
    assert out.tolist() == [[0, 1], [1, 0]]
    assert left.tolist() == [0, 0]


def test_plan_quotas_levels_each_provider_and_puts_unplaceable_on_the_deadline_day() -> None:
    sun = date(2026, 11, 22)
    week = [sun + timedelta(i) for i in range(7)]
    days = pd.DataFrame({
        "org_code": ["A"] * 7 + ["B"] * 7,
        "date": week * 2,
        "base_load": [10.0] * 7 + [0.0] * 7,
        "capacity": [100] * 7 + [1] * 7,
    })
    classes = pd.DataFrame({"org_code": ["A", "B"], "release": [sun, sun],
                            "deadline": [week[-1], week[-1]], "count": [70, 9]})
    out = plan_quotas(days, classes, {"A": 1.0, "B": 3.0})
    a = out[out["org_code"] == "A"]
    b = out[out["org_code"] == "B"]
    assert a["batch_quota"].tolist() == [10] * 7
    assert (a["total"] == 20.0).all()
    assert b["batch_quota"].tolist() == [1] * 7
    assert b["unplaceable"].tolist() == [0] * 6 + [2]
    assert (b["total"] == 3.0).all()
