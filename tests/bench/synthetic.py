"""Seeded synthetic inputs for the planner benchmarks: usage history and due-consent classes."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pandas as pd

#: Weekday multipliers, Monday first (date.weekday()).
WEEKDAY = np.array([1.05, 1.0, 1.0, 1.0, 1.1, 0.7, 0.6])
PAYDAY = {21: 1.1, 22: 1.12, 23: 1.18, 24: 1.25, 25: 1.6, 26: 1.2}


def _month_end(day: date) -> bool:
    return (day + timedelta(days=2)).month != day.month


def usage_history(providers: list[str], start: date, end: date, seed: int = 7) -> pd.DataFrame:
    """Daily user calls per provider from ``start`` to ``end`` (exclusive)."""
    rng = np.random.default_rng(seed)
    days = [start + timedelta(days=i) for i in range((end - start).days)]
    wd = np.array([WEEKDAY[d.weekday()] for d in days])
    pay = np.array([PAYDAY.get(d.day, 1.0) for d in days])
    mend = np.array([1.25 if _month_end(d) else (1.1 if d.day <= 2 else 1.0) for d in days])
    t = np.arange(len(days)) / 7.0
    frames = []
    for org in providers:
        level = rng.lognormal(np.log(200_000), 0.8)
        amp_w, amp_p, amp_m = rng.uniform(0.6, 1.4, 3)
        trend = rng.normal(0.0, 0.01)
        shape = (1 + amp_w * (wd - 1)) * (1 + amp_p * (pay - 1)) * (1 + amp_m * (mend - 1))
        noise = rng.lognormal(0.0, 0.05, len(days))
        calls = level * shape * np.exp(trend * t) * noise
        calls[rng.random(len(days)) < 0.005] = 0.0        # an outage day now and then
        frames.append(pd.DataFrame({"org_code": org, "date": days,
                                    "user_calls": np.round(calls).astype(np.int64)}))
    return pd.concat(frames, ignore_index=True)
