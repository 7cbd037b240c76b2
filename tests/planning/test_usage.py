"""The usage model: weekday and payday shape, short or missing history, no leakage."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest

from planning.usage import forecast, mape, naive_forecast

SUNDAY = date(2026, 11, 22)
WEEK = [SUNDAY + timedelta(days=i) for i in range(7)]


def _history(days: int, *, payday: float = 1.0, org: str = "A") -> pd.DataFrame:
    rows = []
    for i in range(1, days + 1):
        d = SUNDAY - timedelta(days=i)
        v = 400.0 if d.weekday() < 5 else 100.0
        if d.day == 25:
            v *= payday
        rows.append((org, d, v))
    return pd.DataFrame(rows, columns=["org_code", "date", "user_calls"])


def test_weekday_shape_is_learnt() -> None:
    f = forecast(_history(60), WEEK)
    got = f["forecast_user_calls"].to_numpy()
    assert got == pytest.approx([100, 400, 400, 400, 400, 400, 100], rel=0.02)


def test_the_payday_peak_is_forecast_on_the_25th() -> None:
    f = forecast(_history(182, payday=1.8), WEEK).set_index("date")["forecast_user_calls"]
    wed_25 = float(f[date(2026, 11, 25)])
    assert wed_25 > 1.5 * float(f[date(2026, 11, 24)])
    naive = naive_forecast(_history(182, payday=1.8), WEEK).set_index("date")
    assert float(naive.loc[date(2026, 11, 25), "forecast_user_calls"]) == 400.0


def test_an_outage_day_does_not_drag_the_forecast_down() -> None:
    h = _history(60)
    h.loc[h["date"] == SUNDAY - timedelta(days=5), "user_calls"] = 0.0      # a Tuesday
    f = forecast(h, WEEK).set_index("date")["forecast_user_calls"]
    assert float(f[SUNDAY + timedelta(days=2)]) == pytest.approx(400, rel=0.03)


def test_short_history_borrows_the_shape_of_other_providers() -> None:
    long = _history(120, org="A")
    short = _history(3, org="B")                 # Thu, Fri, Sat only
    short["user_calls"] *= 10
    f = forecast(pd.concat([long, short]), WEEK)
    b = f[f["org_code"] == "B"]["forecast_user_calls"].to_numpy()
    assert b[1] > 2 * b[0]                        # Monday well above Sunday, like A
    assert np.all(b > 0)


def test_no_history_forecasts_zero_and_future_rows_are_ignored() -> None:
    h = pd.concat([_history(30), pd.DataFrame({"org_code": ["A"], "date": [SUNDAY],
                                               "user_calls": [10**9]})])
    f = forecast(h, WEEK, org_codes=["A", "Z"])
    assert (f[f["org_code"] == "Z"]["forecast_user_calls"] == 0).all()
    assert f[f["org_code"] == "A"]["forecast_user_calls"].max() < 1000


def test_mape_ignores_days_without_actual_calls() -> None:
    assert mape([100, 0, 200], [110, 5, 180]) == pytest.approx(0.1)
    assert mape([0], [3]) == 0.0
