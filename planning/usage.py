"""The usage model: each provider's user-initiated calls per day, forecast for a week.

A log-linear model per provider, ``log(1 + calls) = level + trend * weeks + weekday effect
+ day-of-month effect``: seven weekday effects (the free level absorbs their mean); the
day-of-month effects are the payday days (21st to 25th, where salaries cluster), the first
two days of a month and its last two (card and insurance debits). Each provider's effects
are shrunk (ridge) toward the effects pooled over all providers, so a provider with a short
or gappy history borrows the common shape; the trend needs three weeks of history and is
bounded. Days far from their weekday's median (outages) are left out of every fit. No
history at all forecasts 0, i.e. "no known user load".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, timedelta

import numpy as np
import numpy.typing as npt
import pandas as pd

PAYDAY_DAYS = (21, 22, 23, 24, 25)
FEATURES = (
    "mon", "tue", "wed", "thu", "fri", "sat", "sun",
    *(f"dom{d}" for d in PAYDAY_DAYS),
    "month_start", "month_end",
)
#: Ridge strength toward the pooled effects (in days of evidence).
SHRINK = 4.0
#: Ridge strength on the trend; and its bound, in log units per week (about +-10%).
TREND_SHRINK = 50.0
MAX_TREND = 0.1
MIN_TREND_DAYS = 21
MAX_HISTORY_DAYS = 182
OUTLIER_LOG = 1.0

FloatArray = npt.NDArray[np.float64]


def features(days: Sequence[date] | pd.Series) -> FloatArray:
    """The calendar design matrix (rows: days, columns: :data:`FEATURES`)."""
    ts = pd.to_datetime(pd.Series(list(days)))
    n = len(ts)
    out = np.zeros((n, len(FEATURES)))
    if n == 0:
        return out
    wd = ts.dt.day_of_week.to_numpy()          # Monday=0 .. Sunday=6
    for j in range(7):
        out[:, j] = wd == j
    dom = ts.dt.day.to_numpy()
    for j, d in enumerate(PAYDAY_DAYS):
        out[:, 7 + j] = dom == d
    out[:, 12] = dom <= 2
    out[:, 13] = dom > ts.dt.days_in_month.to_numpy() - 2
    return out


def _history(history: pd.DataFrame, first: date) -> pd.DataFrame:
    col = "date" if "date" in history.columns else "day"
    h = pd.DataFrame({
        "org_code": history["org_code"].astype(str),
        "date": pd.to_datetime(history[col]).dt.date,
        "user_calls": pd.to_numeric(history["user_calls"], errors="coerce"),
    })
    h = h[(h["date"] < first) & (h["date"] >= first - timedelta(days=MAX_HISTORY_DAYS))]
    h = h[h["user_calls"].notna() & (h["user_calls"] >= 0)]
    return h.drop_duplicates(["org_code", "date"], keep="last")


def _solve(x: FloatArray, y: FloatArray, prior: FloatArray, penalty: FloatArray) -> FloatArray:
    a = x.T @ x + np.diag(penalty)
    rhs = x.T @ y + penalty * prior
    return np.asarray(np.linalg.lstsq(a, rhs, rcond=None)[0], dtype=np.float64)


def _pooled(h: pd.DataFrame) -> FloatArray:
    """Effects common to all providers: their demeaned log calls on the calendar features."""
    if h.empty:
        return np.zeros(len(FEATURES))
    logs = pd.Series(np.log1p(h["user_calls"].to_numpy(float)), index=h.index)
    y = (logs - logs.groupby(h["org_code"]).transform("mean")).to_numpy(float)
    x = features(h["date"])
    x = x - x.mean(axis=0)
    # A tiny ridge only resolves the weekday dummies' collinearity (they sum to one).
    return _solve(x, y, np.zeros(len(FEATURES)), np.full(len(FEATURES), 1e-3))


def _drop_outliers(h: pd.DataFrame) -> pd.DataFrame:
    """Drop days far from the provider's median for that weekday (outage days, one-off
    spikes): more than :data:`OUTLIER_LOG` in log units (a factor of e), which a payday
    peak never is. Judged against a median, so one bad day cannot mask itself."""
    if h.empty:
        return h
    logs = pd.Series(np.log1p(h["user_calls"].to_numpy(float)), index=h.index)
    weekday = pd.to_datetime(h["date"]).dt.day_of_week
    med = logs.groupby([h["org_code"], weekday]).transform("median")
    return h[(logs - med).abs() <= OUTLIER_LOG]


def _fit_one(weeks: FloatArray, feats: FloatArray, calls: FloatArray, pooled: FloatArray
             ) -> tuple[FloatArray, float]:
    """Coefficients [level, trend, *effects] for one provider, and its smearing factor.

    ``weeks``: each history day's offset from the first forecast day, in weeks.
    """
    x = np.column_stack([np.ones(len(weeks)), weeks, feats])
    y = np.log1p(calls)
    span = round((weeks.max() - weeks.min()) * 7) + 1
    trend_pen = TREND_SHRINK if span >= MIN_TREND_DAYS else 1e9
    penalty = np.concatenate(([0.0, trend_pen], np.full(len(FEATURES), SHRINK)))
    prior = np.concatenate(([0.0, 0.0], pooled))
    beta = _solve(x, y, prior, penalty)
    resid = y - x @ beta
    beta[1] = float(np.clip(beta[1], -MAX_TREND, MAX_TREND))
    smear = float(np.mean(np.exp(resid))) if resid.size else 1.0
    return beta, min(max(smear, 1.0), 1.5)


def forecast(history: pd.DataFrame, days: Sequence[date],
             org_codes: Iterable[str] | None = None) -> pd.DataFrame:
    """Forecast user calls for each provider and each of ``days``.

    ``history``: org_code, date (or day), user_calls; only days before ``min(days)`` are
    used. ``org_codes``: providers to forecast (default: those in the history); one with no
    history gets 0. Returns org_code, date, forecast_user_calls (float, >= 0).
    """
    days = sorted(days)
    if not days:
        raise ValueError("no days to forecast")
    first = days[0]
    h = _history(history, first)
    orgs = sorted(set(org_codes) if org_codes is not None else set(h["org_code"]))
    h = _drop_outliers(h)
    pooled = _pooled(h)
    fx = features(days)
    weeks = np.array([(d - first).days / 7.0 for d in days])
    rows: list[pd.DataFrame] = []
    hx = features(h["date"])
    hweeks = (pd.to_datetime(h["date"]) - pd.Timestamp(first)).dt.days.to_numpy(float) / 7.0
    hcalls = h["user_calls"].to_numpy(float)
    groups = {str(k): v for k, v in h.reset_index(drop=True).groupby("org_code").indices.items()}
    for org in orgs:
        ix = groups.get(org)
        if ix is None or len(ix) == 0:
            pred = np.zeros(len(days))
        else:
            beta, smear = _fit_one(hweeks[ix], hx[ix], hcalls[ix], pooled)
            pred = np.expm1(beta[0] + beta[1] * weeks + fx @ beta[2:]) * smear
            pred = np.maximum(pred, 0.0)
        rows.append(pd.DataFrame({"org_code": org, "date": days, "forecast_user_calls": pred}))
    if not rows:
        return pd.DataFrame({"org_code": pd.Series(dtype=str), "date": pd.Series(dtype=object),
                             "forecast_user_calls": pd.Series(dtype=float)})
    return pd.concat(rows, ignore_index=True)


def naive_forecast(history: pd.DataFrame, days: Sequence[date],
                   org_codes: Iterable[str] | None = None) -> pd.DataFrame:
    """The baseline: the same weekday of the last week before ``min(days)`` (0 if absent)."""
    days = sorted(days)
    first = days[0]
    h = _history(history, first)
    orgs = sorted(set(org_codes) if org_codes is not None else set(h["org_code"]))
    last = {(o, d): v for o, d, v in zip(h["org_code"], h["date"], h["user_calls"],
                                         strict=True)}
    rows = []
    for org in orgs:
        for d in days:
            src = d - timedelta(days=7 * (1 + (d - first).days // 7))
            rows.append((org, d, float(last.get((org, src), 0.0))))
    return pd.DataFrame(rows, columns=["org_code", "date", "forecast_user_calls"])


def mape(actual: Sequence[float] | FloatArray, predicted: Sequence[float] | FloatArray) -> float:
    """Mean absolute percentage error over days with actual > 0."""
    a = np.asarray(actual, dtype=float)
    p = np.asarray(predicted, dtype=float)
    ok = a > 0
    if not ok.any():
        return 0.0
    return float(np.mean(np.abs(p[ok] - a[ok]) / a[ok]))
