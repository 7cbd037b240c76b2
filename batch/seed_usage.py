"""The synthetic user-call model behind ``seed``: weekday, payday and month-end effects.

MYDATA.md's load shape: weekdays above weekends (trading days for securities), a payday
peak around the 25th (salaries land on the 21st-25th), card and insurance debits at month
end, plus a mild trend and noise.
"""

from __future__ import annotations

import calendar
from collections.abc import Sequence
from datetime import date

import numpy as np
from numpy.typing import NDArray

#: Mon..Sun multipliers; securities trade on weekdays only.
WEEKDAY = (1.04, 1.0, 1.0, 1.0, 1.08, 0.78, 0.70)
WEEKDAY_INVEST = (1.05, 1.0, 1.0, 1.0, 1.02, 0.32, 0.28)
#: Day of month -> share of the payday bump (peak on the 25th).
PAYDAY = {21: 0.3, 22: 0.45, 23: 0.6, 24: 0.8, 25: 1.0, 26: 0.45, 27: 0.15}
PAYDAY_SIZE = {"bank": 0.35, "card": 0.25, "invest": 0.20, "insu": 0.15, "capital": 0.30}
#: Month-end debits: the last three days of a month and the 1st.
MONTH_END_SIZE = {"card": 0.30, "insu": 0.25}


def usage_series(rng: np.random.Generator, industry: str, consents: int,
                 days: Sequence[date]) -> NDArray[np.int64]:
    """Daily user-initiated calls to one provider over ``days``."""
    n = len(days)
    base = consents * float(rng.uniform(0.8, 2.5)) + float(rng.uniform(300, 3000))
    weekday = WEEKDAY_INVEST if industry == "invest" else WEEKDAY
    wd = np.array([weekday[d.weekday()] for d in days])
    payday = np.array([PAYDAY.get(d.day, 0.0) for d in days]) * PAYDAY_SIZE.get(industry, 0.2)
    month_end = np.array([
        1.0 if d.day == 1 or d.day > calendar.monthrange(d.year, d.month)[1] - 3 else 0.0
        for d in days
    ]) * MONTH_END_SIZE.get(industry, 0.0)
    trend = 1.0 + float(rng.uniform(-0.05, 0.12)) * np.arange(n) / max(n - 1, 1)
    noise = rng.lognormal(0.0, 0.04, size=n)
    calls = base * wd * (1.0 + payday + month_end) * trend * noise
    return np.rint(calls).astype(np.int64)
