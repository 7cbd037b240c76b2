"""Seeded synthetic inputs for the planner benchmarks: usage history and due-consent classes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta

import numpy as np
import pandas as pd

from planning.quotas import ConsentClass

#: Weekday multipliers, Monday first (date.weekday()).
WEEKDAY = np.array([1.05, 1.0, 1.0, 1.0, 1.1, 0.7, 0.6])
PAYDAY = {21: 1.1, 22: 1.12, 23: 1.18, 24: 1.25, 25: 1.6, 26: 1.2}


def _month_end(day: date) -> bool:
    return (day + timedelta(days=2)).month != day.month


def usage_history(providers: list[str], start: date, end: date, seed: int = 7,
                  levels: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Daily user calls per provider from ``start`` to ``end`` (exclusive).

    Weekday shape, payday peak (21st-26th, highest on the 25th), month-end and month-start
    debits, a small trend, 5% noise and an outage day now and then; each provider has its
    own amplitudes.
    """
    rng = np.random.default_rng(seed)
    days = [start + timedelta(days=i) for i in range((end - start).days)]
    wd = np.array([WEEKDAY[d.weekday()] for d in days])
    pay = np.array([PAYDAY.get(d.day, 1.0) for d in days])
    mend = np.array([1.25 if _month_end(d) else (1.1 if d.day <= 2 else 1.0) for d in days])
    t = np.arange(len(days)) / 7.0
    frames = []
    for org in providers:
        level = levels[org] if levels else rng.lognormal(np.log(200_000), 0.8)
        amp_w, amp_p, amp_m = rng.uniform(0.6, 1.4, 3)
        trend = rng.normal(0.0, 0.01)
        shape = (1 + amp_w * (wd - 1)) * (1 + amp_p * (pay - 1)) * (1 + amp_m * (mend - 1))
        noise = rng.lognormal(0.0, 0.05, len(days))
        calls = level * shape * np.exp(trend * (t - t[-1])) * noise
        calls[rng.random(len(days)) < 0.005] = 0.0        # an outage day now and then
        frames.append(pd.DataFrame({"org_code": org, "date": days,
                                    "user_calls": np.round(calls).astype(np.int64)}))
    return pd.concat(frames, ignore_index=True)


def consent_counts(providers: list[str], total: int, seed: int = 11) -> dict[str, int]:
    """``total`` consents split over providers, heavy-tailed like real operators."""
    rng = np.random.default_rng(seed)
    share = rng.lognormal(0.0, 1.0, len(providers))
    counts = np.floor(total * share / share.sum()).astype(np.int64)
    counts[: total - int(counts.sum())] += 1
    return {p: int(n) for p, n in zip(providers, counts, strict=True)}


def week_classes(count: int, rng: np.random.Generator) -> list[ConsentClass]:
    """One provider's due consents as classes over days 0..6 (Sunday first).

    About 2% backlog from last week (due on Sunday), 5-10% released later in the week
    (new consents, deferrals with a not_before), the rest due any day of the week.
    """
    backlog = int(count * rng.uniform(0.01, 0.03))
    late = int(count * rng.uniform(0.05, 0.10))
    late_days = rng.multinomial(late, [1 / 6] * 6)
    classes = [ConsentClass(0, 0, backlog)]
    classes += [ConsentClass(d + 1, 6, int(n)) for d, n in enumerate(late_days)]
    classes.append(ConsentClass(0, 6, count - backlog - late))
    return classes
