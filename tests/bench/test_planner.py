"""Planner benchmark: a seeded synthetic week, 300 providers, 5,000,000 consents, payday inside.

Run: PYTHONPATH=$PWD python -m pytest -q -s tests/bench/test_planner.py

Prints, side by side, the peak-to-mean ratio of (user + batch) calls per provider for the
uniform 1/7 split, inverse weighting, everything on Sunday (a weekly cron) and ours; ours
against the LP lower bound; deadline misses; time and peak memory to plan. And the usage
model's forecast error on held-out weeks against last week's same weekday.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from collections.abc import Callable
from datetime import date, timedelta

import numpy as np
import pandas as pd

from planning.quotas import ConsentClass, deadline_misses, least_peak, level, lower_bound
from planning.usage import forecast, mape, naive_forecast
from tests.bench.synthetic import consent_counts, usage_history, week_classes

PROVIDERS = [f"BANK{i:06d}" for i in range(300)]
CONSENTS = 5_000_000
SUNDAY = date(2026, 11, 22)                 # Sun 22 .. Sat 28: payday Wednesday the 25th
WEEK = [SUNDAY + timedelta(days=i) for i in range(7)]
CALLS_PER_CONSENT = 3.0
WINDOW_MINUTES = 360
SEED = 20261122


def _largest_remainder(total: int, share: np.ndarray) -> np.ndarray:
    ideal = total * share / share.sum()
    x = np.floor(ideal).astype(np.int64)
    x[np.argsort(-(ideal - x), kind="stable")[: total - int(x.sum())]] += 1
    return x


def _strategies() -> dict[str, Callable[[np.ndarray, int], np.ndarray]]:
    return {
        "uniform 1/7": lambda base, n: _largest_remainder(n, np.ones(7)),
        "inverse weighting": lambda base, n: _largest_remainder(n, 1.0 / np.maximum(base, 1.0)),
        "Sunday cron": lambda base, n: np.array([n, 0, 0, 0, 0, 0, 0], dtype=np.int64),
    }


def _world() -> tuple[pd.DataFrame, dict[str, list[ConsentClass]], dict[str, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    counts = consent_counts(PROVIDERS, CONSENTS, seed=SEED)
    # user calls about four times the batch's calls (scheduled calls ~ a fifth of all calls)
    levels = {p: 4 * counts[p] * CALLS_PER_CONSENT / 7 * rng.lognormal(0.0, 0.3)
              for p in PROVIDERS}
    usage = usage_history(PROVIDERS, date(2025, 11, 23), WEEK[-1] + timedelta(days=1),
                          seed=SEED, levels=levels)
    classes = {p: week_classes(counts[p], rng) for p in PROVIDERS}
    # per-minute cap from calls_per_second: 1.5x to 4x what an average day needs
    capacity = {}
    for p in PROVIDERS:
        per_min = max(1, int(np.ceil(counts[p] / 7 / WINDOW_MINUTES * rng.uniform(1.5, 4.0))))
        capacity[p] = np.full(7, per_min * WINDOW_MINUTES, dtype=np.int64)
    return usage, classes, capacity


def _plan(usage: pd.DataFrame, classes: dict[str, list[ConsentClass]],
          capacity: dict[str, np.ndarray]
          ) -> tuple[pd.DataFrame, dict[str, tuple[int, ...]], float]:
    t0 = time.perf_counter()
    fc = forecast(usage[usage["date"] < SUNDAY], WEEK, PROVIDERS)
    took = time.perf_counter() - t0
    base = {str(o): g["forecast_user_calls"].to_numpy(float)
            for o, g in fc.groupby("org_code", sort=False)}
    plans = {p: level(base[p], capacity[p], classes[p], weight=CALLS_PER_CONSENT).quotas
             for p in PROVIDERS}
    return fc, plans, took


def _peak_to_mean(base: np.ndarray, x: np.ndarray) -> float:
    total = base + CALLS_PER_CONSENT * x
    return float(total.max() / total.mean())


def test_planner_week_side_by_side() -> None:
    usage, classes, capacity = _world()
    due = sum(k.count for ks in classes.values() for k in ks)
    assert due == CONSENTS

    # Timed untraced (tracemalloc slows Python down several times), then traced once.
    t0 = time.perf_counter()
    fc, ours, forecast_s = _plan(usage, classes, capacity)
    elapsed = time.perf_counter() - t0
    tracemalloc.start()
    _plan(usage, classes, capacity)
    _, peak_mem = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    base_fc = {str(o): g["forecast_user_calls"].to_numpy(float)
               for o, g in fc.groupby("org_code", sort=False)}
    actual = usage[usage["date"] >= SUNDAY]
    base_act = {str(o): g.sort_values("date")["user_calls"].to_numpy(float)
                for o, g in actual.groupby("org_code", sort=False)}

    rows = []
    strategies = _strategies()
    names = [*strategies, "ours"]
    for name in names:
        ptm_fc, ptm_act, misses = [], [], 0
        for p in PROVIDERS:
            n = sum(k.count for k in classes[p])
            x = (np.asarray(ours[p]) if name == "ours"
                 else strategies[name](base_fc[p], n))
            ptm_fc.append(_peak_to_mean(base_fc[p], x))
            ptm_act.append(_peak_to_mean(base_act[p], x))
            misses += deadline_misses(np.minimum(x, capacity[p]), classes[p])
        rows.append((name, np.mean(ptm_fc), np.max(ptm_fc), np.mean(ptm_act),
                     np.max(ptm_act), misses))

    lb_ratio, int_ratio, gap = [], [], []
    for p in PROVIDERS:
        ours_peak = float((base_fc[p] + CALLS_PER_CONSENT * np.asarray(ours[p])).max())
        lp = lower_bound(base_fc[p], capacity[p], classes[p], weight=CALLS_PER_CONSENT)
        lb_ratio.append(ours_peak / lp)
        gap.append(ours_peak - lp)
        int_ratio.append(ours_peak / least_peak(base_fc[p], capacity[p], classes[p],
                                                weight=CALLS_PER_CONSENT))
    placed = sum(sum(q) for q in ours.values())

    print()
    print(f"Planner benchmark: {len(PROVIDERS)} providers, {CONSENTS:,} consents as "
          f"{sum(len(k) for k in classes.values()):,} classes, week {WEEK[0]}..{WEEK[-1]} "
          "(payday Wed 25th), user calls ~4x batch calls")
    print("peak-to-mean of (user + batch) calls per provider, mean / max over providers")
    print(f"{'strategy':<20} {'forecast load':>20} {'actual load':>20} {'deadline misses':>16}")
    for name, fm, fx, am, ax, miss in rows:
        print(f"{name:<20} {fm:>9.4f} / {fx:>8.4f} {am:>9.4f} / {ax:>8.4f} {miss:>16,}")
    print(f"ours / LP lower bound of the peak: mean {np.mean(lb_ratio):.6f}, "
          f"max {np.max(lb_ratio):.6f}; largest gap {np.max(gap):.2f} calls, under one "
          f"consent ({CALLS_PER_CONSENT:g} calls): the integrality gap of small providers")
    print(f"ours / least integer peak (Hall binary search): mean {np.mean(int_ratio):.9f}, "
          f"max {np.max(int_ratio):.9f} (1.0 = optimal)")
    print(f"placed {placed:,} of {CONSENTS:,}; unplaceable {CONSENTS - placed:,}")
    print(f"time to plan: {elapsed:.2f} s (forecast {forecast_s:.2f} s, quotas "
          f"{elapsed - forecast_s:.2f} s; goal < 10 s); "
          f"peak traced memory {peak_mem / 2**20:.1f} MiB, process max RSS "
          f"{rss / 2**20:.0f} MiB (goal < 2 GiB)")

    ours_row = rows[-1]
    assert ours_row[5] == 0
    assert placed == CONSENTS
    assert max(gap) < CALLS_PER_CONSENT
    assert max(int_ratio) < 1 + 1e-9
    assert all(ours_row[1] <= r[1] + 1e-12 for r in rows)


def test_usage_forecast_error_on_held_out_weeks() -> None:
    usage, _, _ = _world()
    print()
    print("usage model: MAPE on held-out weeks (history strictly before each week)")
    print(f"{'week':<12} {'model':>8} {'naive (last week same weekday)':>32} {'ratio':>7}")
    ours_all, naive_all = [], []
    for k in range(8, 0, -1):
        start = SUNDAY - timedelta(days=7 * (k - 1))
        days = [start + timedelta(days=i) for i in range(7)]
        hist = usage[usage["date"] < start]
        actual = usage[usage["date"].isin(days)]
        t0 = time.perf_counter()
        f = forecast(hist, days, PROVIDERS)
        took = time.perf_counter() - t0
        nv = naive_forecast(hist, days, PROVIDERS)
        m = actual.merge(f, on=["org_code", "date"]).merge(nv, on=["org_code", "date"],
                                                             suffixes=("", "_naive"))
        e_model = mape(m["user_calls"], m["forecast_user_calls"])
        e_naive = mape(m["user_calls"], m["forecast_user_calls_naive"])
        ours_all.append(e_model)
        naive_all.append(e_naive)
        tag = " payday" if any(d.day == 25 for d in days) else ""
        print(f"{start!s:<12} {e_model:>8.2%} {e_naive:>32.2%} {e_model / e_naive:>7.2f}"
              f"   ({took:.2f} s){tag}")
    print(f"{'mean':<12} {np.mean(ours_all):>8.2%} {np.mean(naive_all):>32.2%} "
          f"{np.mean(ours_all) / np.mean(naive_all):>7.2f}")
    assert np.mean(ours_all) < np.mean(naive_all)
