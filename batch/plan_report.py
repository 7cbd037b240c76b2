"""The week's plan for a person (aligned tables) or a machine (records, CSV).

Used by ``mydata-batch plan`` and the demo; no command-line code here.
"""

from __future__ import annotations

import io
from datetime import date
from typing import Any

import numpy as np
import pandas as pd

from batch.planner import WeekPlan

MACHINE_COLUMNS = ["org_code", "date", "forecast_user_calls", "batch_quota", "batch_calls",
                   "total", "capacity", "unplaceable", "overdue", "planned"]
_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def to_records(plan: WeekPlan) -> list[dict[str, Any]]:
    """One object per provider and day, JSON-ready (dates as ISO strings)."""
    out = []
    for row in plan.days[MACHINE_COLUMNS].itertuples(index=False):
        rec = dict(zip(MACHINE_COLUMNS, row, strict=True))
        rec["date"] = rec["date"].isoformat()
        for k in MACHINE_COLUMNS[2:-1]:
            rec[k] = int(rec[k])
        rec["planned"] = bool(rec["planned"])
        out.append(rec)
    return out


def to_csv(plan: WeekPlan) -> str:
    buf = io.StringIO()
    plan.days[MACHINE_COLUMNS].to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def _n(v: Any) -> str:
    return f"{round(float(v)):,}"


def provider_summary(g: pd.DataFrame) -> dict[str, float]:
    """Peak, mean, and the uniform split's peak for one provider's seven rows.

    The uniform split spreads the planned days' batch evenly over those days (1/7 a day
    when the whole week is planned); days already past stay as they were.
    """
    user = g["forecast_user_calls"].to_numpy(float)
    total = g["total"].to_numpy(float)
    planned = g["planned"].to_numpy(bool)
    even = np.where(planned, float(g["batch_calls"][planned].sum()) / max(1, planned.sum()),
                    g["batch_calls"].to_numpy(float))
    uniform_peak = float((user + even).max()) if len(user) else 0.0
    peak = float(total.max()) if len(total) else 0.0
    mean = float(total.mean()) if len(total) else 0.0
    return {"peak": peak, "mean": mean, "uniform_peak": uniform_peak,
            "ratio": peak / uniform_peak if uniform_peak else 1.0}


def to_table(plan: WeekPlan, *, saved: bool,
             actual: frozenset[tuple[str, date]] | None = None) -> str:
    """Aligned per-provider tables, the peak against the uniform split, totals, and loud
    warnings for consents that cannot fit this week. A past day is labelled "(actual)"
    only where ``actual`` (provider, day) has usage rows, as on the dashboard."""
    days = plan.week
    lines: list[str] = []
    action = "saved" if saved else "dry run: nothing saved (--save stores it)"
    lines.append(f"Week {days[0]} (Sun) .. {days[-1]} (Sat), planned from {plan.today}; "
                 f"{action}")
    unpl = plan.unplaceable()
    if unpl:
        lines.append("")
        lines.append(f"!!! {sum(unpl.values()):,} CONSENTS CANNOT BE PLACED THIS WEEK "
                     f"at {len(unpl)} provider(s): "
                     + ", ".join(f"{o} {n:,}" for o, n in sorted(unpl.items())) + " !!!")
        lines.append("!!! their windows x per-minute cap cannot hold the week's work; "
                     "widen the windows or raise calls_per_second !!!")
    header = ("date", "day", "user calls", "batch", "batch calls", "total", "capacity",
              "unplaceable", "overdue", "")
    tot_user = tot_batch = tot_calls = 0
    for org, g in plan.days.groupby("org_code", sort=True):
        lim = plan.limits.get(str(org))
        lines.append("")
        desc = f"{org}"
        if lim is not None:
            desc += (f"  windows {', '.join(str(w) for w in lim.windows)}"
                     f"  cap {lim.per_minute_cap:,}/min"
                     f"  ({lim.calls_per_second:g} calls/s, {lim.calls_per_consent:g}"
                     " calls/consent)")
        lines.append(desc)
        body = [header]
        for r in g.to_dict("records"):
            day: date = r["date"]
            body.append((day.isoformat(), _DAY_NAMES[day.weekday()],
                         _n(r["forecast_user_calls"]), _n(r["batch_quota"]),
                         _n(r["batch_calls"]), _n(r["total"]), _n(r["capacity"]),
                         _n(r["unplaceable"]) if r["unplaceable"] else "-",
                         _n(r["overdue"]) if r["overdue"] else "-",
                         "" if r["planned"] else "(actual)" if actual is None
                         or (str(org), day) in actual else "(past; forecast)"))
        s = provider_summary(g)
        body.append(("week", "", _n(g["forecast_user_calls"].sum()), _n(g["batch_quota"].sum()),
                     _n(g["batch_calls"].sum()), _n(g["total"].sum()), "",
                     _n(g["unplaceable"].sum()) if g["unplaceable"].sum() else "-",
                     _n(g["overdue"].sum()) if g["overdue"].sum() else "-", ""))
        widths = [max(len(row[i]) for row in body) for i in range(len(header))]
        for row in body:
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [row[i].rjust(widths[i]) for i in range(2, len(header) - 1)]
            cells.append(row[-1])
            lines.append("  " + "  ".join(cells).rstrip())
        peak_day: date | None = g["date"].tolist()[int(g["total"].to_numpy().argmax())] \
            if len(g) else None
        lines.append(
            f"  peak {_n(s['peak'])} calls"
            + (f" on {_DAY_NAMES[peak_day.weekday()]} {peak_day}" if peak_day else "")
            + f"; peak/mean {s['peak'] / s['mean'] if s['mean'] else 1.0:.3f}"
            f"; an even split would peak at {_n(s['uniform_peak'])}"
            f" (ours/uniform {s['ratio']:.3f})")
        if g["unplaceable"].sum():
            lines.append(f"  !!! {int(g['unplaceable'].sum()):,} consents cannot be placed "
                         "this week !!!")
        overdue = int(g.loc[g["planned"], "overdue"].sum())
        if overdue:
            lines.append(f"  {overdue:,} consents overdue (not fetched in an earlier week): "
                         "levelled over the week, claimed first each day")
        tot_user += int(g["forecast_user_calls"].sum())
        tot_batch += int(g["batch_quota"].sum())
        tot_calls += int(g["total"].sum())
    lines.append("")
    lines.append(f"Totals: {plan.days['org_code'].nunique()} providers, user calls "
                 f"{tot_user:,}, batch {tot_batch:,} consents, total {tot_calls:,} calls, "
                 f"unplaceable {sum(unpl.values()):,}")
    return "\n".join(lines)
