"""The dashboard page: one self-contained HTML document with inline CSS and SVG.

Pure: a :class:`~batch.dashboard.data.Snapshot` in, a string out. No script, no external
resource (a Content-Security-Policy forbids them), and every piece of text from the
database goes through :func:`esc`, so the page works offline and cannot be injected into.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import date, datetime, timedelta

from batch.dashboard.data import DayLoad, RunRow, Snapshot
from batch.dashboard.figures import (
    ALL,
    Flatness,
    Progress,
    Status,
    day_loads,
    flatness,
    progress,
)
from planning.calendar import KST, week_start

USER = "#4e79a7"
BATCH_PLANNED = "#f5c99b"
BATCH_DONE = "#e07b24"
BAD = "#c0392b"
WARN = "#b9770e"
GOOD = "#2e7d4f"
MUTED = "#6b7280"
ERROR_SHOWN = 160

CSS = f"""
:root {{ --user: {USER}; --plan: {BATCH_PLANNED}; --done: {BATCH_DONE}; --bad: {BAD};
  --warn: {WARN}; --good: {GOOD}; --muted: {MUTED}; --line: #e5e7eb; --bg: #f8fafc; }}
* {{ box-sizing: border-box; }}
body {{ margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
  "Noto Sans KR", sans-serif; color: #111827; background: var(--bg); }}
header {{ position: sticky; top: 0; z-index: 1; display: flex; flex-wrap: wrap; gap: 6px 18px;
  align-items: baseline; padding: 10px 20px; background: #111827; color: #f9fafb; }}
header h1 {{ font-size: 16px; margin: 0; font-weight: 600; }}
header .week {{ font-size: 15px; }}
header .meta {{ color: #cbd5e1; font-size: 12px; }}
header nav a {{ color: #bfdbfe; font-size: 12px; }}
header code {{ background: #374151; color: #f9fafb; }}
main {{ padding: 12px 20px 40px; max-width: 1280px; margin: 0 auto; }}
section {{ background: #fff; border: 1px solid var(--line); border-radius: 8px;
  padding: 12px 16px; margin: 14px 0; }}
h2 {{ font-size: 15px; margin: 0 0 8px; }}
h3 {{ font-size: 13px; margin: 14px 0 6px; color: #374151; }}
table {{ border-collapse: collapse; margin: 4px 0 8px; font-variant-numeric: tabular-nums; }}
th, td {{ padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: left;
  white-space: nowrap; }}
th {{ font-weight: 600; color: #374151; background: #f9fafb; font-size: 12px; }}
td.n, th.n {{ text-align: right; }}
td.unit {{ color: var(--muted); font-size: 12px; padding-left: 0; }}
tr.consents td {{ background: #fafaf9; }}
td.muted, .muted {{ color: var(--muted); }}
.today {{ background: #fff7ed; }}
th.today {{ background: #fde7cf; }}
tr.total td {{ font-weight: 600; border-top: 2px solid #d1d5db; }}
.pill {{ display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px;
  font-weight: 600; color: #fff; background: var(--muted); }}
.pill.good {{ background: var(--good); }} .pill.bad {{ background: var(--bad); }}
.pill.warn {{ background: var(--warn); }} .pill.info {{ background: var(--user); }}
.bad-text {{ color: var(--bad); font-weight: 600; }}
.swatch {{ display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin: 0 4px 0 12px; vertical-align: -1px; }}
.notice {{ border-left: 4px solid var(--warn); background: #fffbeb; padding: 10px 14px;
  margin: 14px 0; border-radius: 4px; }}
.notice code, code {{ background: #f3f4f6; padding: 1px 5px; border-radius: 4px; }}
.bar {{ display: inline-block; width: 120px; height: 8px; background: #f3f4f6;
  border-radius: 4px; vertical-align: middle; overflow: hidden; }}
.bar span {{ display: block; height: 100%; background: var(--done); }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr));
  gap: 4px 24px; }}
details > summary {{ cursor: pointer; font-weight: 600; margin: 8px 0 2px; }}
svg {{ max-width: 100%; height: auto; display: block; }}
.scroll {{ overflow-x: auto; }}
svg text {{ font: 11px system-ui, sans-serif; fill: #374151; }}
svg .val {{ font-size: 10px; fill: #111827; }}
svg .axis {{ fill: var(--muted); font-size: 10px; }}
"""


def esc(value: object) -> str:
    """HTML-escaped text (quotes too, so it is safe in attributes)."""
    return html.escape(str(value), quote=True)


def num(value: int | float | None) -> str:
    """Thousands separators; an em dash for unknown."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def short(value: float) -> str:
    """Compact axis labels: 950, 12k, 1.2M."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1_000:
        return f"{value / 1_000:.3g}k"
    return f"{value:.0f}"


def day_label(day: date) -> str:
    return f"{day:%a} {day:%m-%d}"


def kst(when: datetime | None) -> str:
    return "—" if when is None else when.astimezone(KST).strftime("%m-%d %H:%M:%S")


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)  # pragma: no cover


def bar_chart(loads: Sequence[DayLoad], *, today: date, title: str,
              width: int = 620, height: int = 220) -> str:
    """Stacked bars per day, in API calls: user calls, then the planned batch calls, with
    the batch calls actually made inside them."""
    left, right, top, bottom = 52, 76, 18, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    top_value = max([x.total_planned_calls for x in loads]
                    + [x.user_calls + x.batch_calls_made for x in loads] + [0])
    ymax = _nice_ceiling(top_value * 1.08)
    slot = plot_w / max(len(loads), 1)
    bar_w = slot * 0.62

    def y(value: float) -> float:
        return top + plot_h - plot_h * value / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
             f"<title>{esc(title)}</title>"]
    for i in range(5):
        v = ymax * i / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" '
                     f'y2="{y(v):.1f}" stroke="#e5e7eb"/>')
        parts.append(f'<text class="axis" x="{left - 6}" y="{y(v) + 3:.1f}" '
                     f'text-anchor="end">{esc(short(v))}</text>')
    for i, x in enumerate(loads):
        x0 = left + i * slot + (slot - bar_w) / 2
        cx = x0 + bar_w / 2
        user, planned, done = x.user_calls, x.planned_calls, x.batch_calls_made
        source = "actual" if x.actual_user_calls is not None else "forecast"
        tip = (f"{day_label(x.day)}: user calls {num(user)} ({source}); batch planned "
               f"{num(x.planned_consents)} consents = {num(planned)} calls; batch done "
               f"{num(x.batch_done)} consents, {num(done)} calls made; user + planned batch "
               f"{num(x.total_planned_calls)} calls")
        parts.append(f"<g><title>{esc(tip)}</title>")
        if x.day == today:
            parts.append(f'<rect x="{left + i * slot:.1f}" y="{top}" width="{slot:.1f}" '
                         f'height="{plot_h}" fill="#fff7ed"/>')
        parts.append(_rect(x0, y(user), bar_w, y(0) - y(user), USER))
        parts.append(_rect(x0, y(user + planned), bar_w, y(user) - y(user + planned),
                           BATCH_PLANNED))
        inner = bar_w * 0.5
        parts.append(_rect(cx - inner / 2, y(user + done), inner, y(user) - y(user + done),
                           BATCH_DONE))
        label_y = min(y(x.total_planned_calls), y(user + done)) - 4
        parts.append(f'<text class="val" x="{cx:.1f}" y="{label_y:.1f}" '
                     f'text-anchor="middle">{esc(num(x.total_planned_calls))}</text>')
        weight = ' font-weight="700"' if x.day == today else ""
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 16}" text-anchor="middle"'
                     f"{weight}>{esc(day_label(x.day))}</text>")
        if x.unplaceable:
            parts.append(f'<text x="{cx:.1f}" y="{height - 4}" text-anchor="middle" '
                         f'fill="{BAD}" font-weight="700">⚠ {esc(num(x.unplaceable))}</text>')
        parts.append("</g>")
    totals = [x.total_planned_calls for x in loads]
    if loads and any(totals):
        mean = sum(totals) / len(totals)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(mean):.1f}" '
                     f'y2="{y(mean):.1f}" stroke="#111827" stroke-dasharray="4 3" '
                     f'stroke-width="1"><title>mean {esc(num(round(mean)))}</title></line>')
        parts.append(f'<text class="axis" x="{width - right + 4}" y="{y(mean) + 3:.1f}">'
                     f"mean {esc(short(mean))}</text>")
    parts.append(f'<text class="axis" x="{left - 6}" y="{top - 6}" text-anchor="end">'
                 "calls</text>")
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
                 'stroke="#9ca3af"/>')
    parts.append("</svg>")
    return "".join(parts)


def _rect(x: float, y: float, w: float, h: float, fill: str) -> str:
    if h <= 0:
        return ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>'


def legend() -> str:
    return (f'<div class="muted">Bars in API calls: <span class="swatch" '
            f'style="background:{USER}"></span>user calls<span class="swatch" '
            f'style="background:{BATCH_PLANNED}"></span>batch calls planned (consents × calls '
            f'per consent)<span class="swatch" style="background:{BATCH_DONE}"></span>batch '
            'calls made<span style="margin-left:12px">- - - mean of user + planned batch'
            "</span> · user calls are actual where known, else the forecast</div>")


def load_table(loads: Sequence[DayLoad], *, today: date, table_id: str) -> str:
    """Rows per measure with their unit (calls or consents), columns per day, the week."""
    def cls(day: date) -> str:
        return ' class="n today"' if day == today else ' class="n"'

    head = "".join(f'<th{cls(x.day)}>{esc(day_label(x.day))}</th>' for x in loads)
    calls, consents = "calls", "consents"
    rows: list[tuple[str, str, list[int | None], bool]] = [
        ("User calls, forecast", calls, [x.forecast_user_calls for x in loads], False),
        ("User calls, actual", calls, [x.actual_user_calls for x in loads], False),
        ("Batch planned", consents, [x.batch_quota for x in loads], False),
        ("Batch planned", calls, [x.batch_planned_calls for x in loads], False),
        ("Batch done", consents, [x.batch_done for x in loads], False),
        ("Batch calls made", calls, [x.batch_calls_made if x.ran else None for x in loads],
         False),
        ("User + batch, planned", calls, [x.total_planned_calls for x in loads], True),
        ("User + batch, actual", calls, [x.total_actual_calls for x in loads], True),
    ]
    if any(x.unplaceable for x in loads):
        rows.append(("Unplaceable", consents, [x.unplaceable for x in loads], False))
    if any(x.overdue for x in loads):
        rows.append(("Overdue (earlier week)", consents, [x.overdue for x in loads], False))
    body = []
    for name, unit, values, total in rows:
        known = [v for v in values if v is not None]
        week = sum(known) if known else None
        cells = "".join(
            f"<td{cls(x.day)}>{_cell(name, v)}</td>" for x, v in zip(loads, values, strict=True))
        classes = " ".join(c for c in ("total" if total else "",
                                       "consents" if unit == consents else "") if c)
        attr = f' class="{classes}"' if classes else ""
        body.append(f'<tr{attr}><td>{esc(name)}</td><td class="unit">{esc(unit)}</td>{cells}'
                    f'<td class="n">{_cell(name, week)}</td></tr>')
    return (f'<div class="scroll"><table id="{esc(table_id)}"><thead><tr><th></th>'
            f'<th class="unit">unit</th>{head}<th class="n">Week</th></tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _cell(name: str, value: int | None) -> str:
    if name == "Unplaceable" and value:
        return f'<span class="bad-text">{esc(num(value))}</span>'
    return esc(num(value))


def flatness_table(rows: Iterable[Flatness]) -> str:
    body = []
    for f in rows:
        better = f.improvement
        note = ("—" if better is None else "same" if abs(better) < 0.0005
                else f"{abs(better) * 100:.1f} % {'lower' if better > 0 else 'higher'}")
        label = "All providers" if f.org_code == ALL else f.org_code
        peak = "—" if f.peak_day is None else day_label(f.peak_day)
        cls = ' class="total"' if f.org_code == ALL else ""
        body.append(f"<tr{cls}><td>{esc(label)}</td><td class=n>{esc(ratio(f.planned))}</td>"
                    f"<td class=n>{esc(ratio(f.uniform))}</td><td>{esc(peak)}</td>"
                    f"<td class=n>{esc(note)}</td></tr>")
    return ('<table id="flatness"><thead><tr><th>Provider</th><th class=n>Peak/mean, plan'
            "</th><th class=n>Peak/mean, uniform 1/7</th><th>Peak day</th>"
            "<th class=n>Plan's peak vs uniform</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


STATUS_PILL = {
    Status.COMPLETE: "good", Status.ON_TRACK: "good", Status.IN_PROGRESS: "info",
    Status.BEHIND: "bad", Status.NOT_STARTED: "", Status.NO_PLAN: "",
}


def progress_table(rows: Sequence[Progress]) -> str:
    body = []
    for p in rows:
        share = p.share
        width = 0 if share is None else min(100, round(share * 100))
        marker = ("⚠ " if p.status is Status.BEHIND else "") + str(p.status)
        body.append(
            f"<tr><td>{esc(p.org_code)}</td><td class=n>{esc(num(p.planned))}</td>"
            f"<td class=n>{esc(num(p.expected))}</td><td class=n>{esc(num(p.done))}</td>"
            f'<td><span class="bar"><span style="width:{width}%"></span></span> '
            f'{"—" if share is None else esc(f"{share * 100:.1f} %")}</td>'
            f'<td><span class="pill {STATUS_PILL[p.status]}">{esc(marker)}</span></td></tr>')
    if not body:
        return '<p class="muted">No providers.</p>'
    return ('<table id="progress-table"><thead><tr><th>Provider</th>'
            "<th class=n>Planned, consents</th><th class=n>Expected by now, consents</th>"
            "<th class=n>Done, consents</th><th>Progress</th>"
            f"<th>Status</th></tr></thead><tbody>{''.join(body)}</tbody></table>")


#: A run still "running" this long after it started has probably lost its worker.
STALE_RUN = timedelta(hours=8)


def run_pill(run: RunRow, now: datetime) -> str:
    """The run's status, coloured; a long-silent "running" run is flagged as stale."""
    s = run.status.lower()
    if s == "running" and run.finished_at is None and now - run.started_at > STALE_RUN:
        hours = int((now - run.started_at).total_seconds() // 3600)
        return (f'<span class="pill warn" title="started {hours} h ago and never finished: '
                f'is its worker alive?">{esc(run.status)}, stale {hours} h</span>')
    kind = ("good" if s in {"ok", "done", "succeeded", "success", "finished", "complete",
                            "completed"}
            else "info" if s == "running"
            else "bad" if s in {"failed", "error", "aborted", "crashed", "killed"}
            else "warn")
    why = f' title="{esc(run.error)}"' if run.error else ""
    return f'<span class="pill {kind}"{why}>{esc(run.status)}</span>'


def runs_table(runs: Sequence[RunRow], now: datetime) -> str:
    if not runs:
        return '<p class="muted">No runs recorded for this week.</p>'
    body = []
    for r in runs:
        t = r.totals
        nums = ("".join(f"<td class=n>{esc(num(v))}</td>" for v in (
            t.planned, t.attempted, t.succeeded, t.failed, t.deferred, t.no_longer_due,
            t.dead_lettered))
            if t is not None else '<td class="muted" colspan=7>no summary</td>')
        body.append(f"<tr><td><code>{esc(r.run_id)}</code></td><td>{esc(r.day)}</td>"
                    f"<td>{esc(r.worker_id)}</td><td>{esc(kst(r.started_at))}</td>"
                    f"<td>{esc(kst(r.finished_at))}</td><td>{run_pill(r, now)}</td>{nums}"
                    "</tr>")
    return ("<table><thead><tr><th>Run</th><th>Day</th><th>Worker</th><th>Started (KST)</th>"
            "<th>Finished (KST)</th><th>Status</th><th class=n>Planned</th>"
            "<th class=n>Attempted</th><th class=n>Succeeded</th><th class=n>Failed</th>"
            "<th class=n>Deferred</th><th class=n title=\"of the day's quota left: revoked, "
            "or refreshed by another run, meanwhile\">No longer due</th>"
            "<th class=n>Dead-lettered</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


KIND_COLOUR = {"success": GOOD, "fault": BAD, "client": BAD, "timeout": WARN,
               "throttled": WARN}


def outcomes_table(snap: Snapshot) -> str:
    if not snap.outcomes:
        return f'<p class="muted">No outcomes recorded on {esc(snap.focus_day)}.</p>'
    body = []
    for o in snap.outcomes:
        colour = KIND_COLOUR.get(o.kind, MUTED)
        body.append(f"<tr><td>{esc(o.org_code)}</td>"
                    f'<td><span style="color:{colour};font-weight:600">{esc(o.kind)}</span></td>'
                    f"<td>{esc(o.action)}</td><td class=n>{esc(num(o.count))}</td>"
                    f"<td class=n>{esc(num(o.calls))}</td></tr>")
    return ("<table><thead><tr><th>Provider</th><th>Kind</th><th>Action</th>"
            "<th class=n>Refreshes</th><th class=n>API calls</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def dead_letters_html(snap: Snapshot) -> str:
    if not snap.dead_letter_groups:
        return '<p class="muted">No open dead letters.</p>'
    groups = "".join(
        f"<tr><td>{esc(g.org_code)}</td><td class=n><span class=bad-text>{esc(num(g.count))}"
        f"</span></td><td>{esc(kst(g.oldest))}</td></tr>" for g in snap.dead_letter_groups)
    recent = "".join(
        f"<tr><td class=n>{esc(d.id)}</td><td class=n>{esc(d.consent_id)}</td>"
        f"<td>{esc(d.org_code)}</td><td>{esc(d.week_start)}</td>"
        f"<td class=n>{esc(d.attempts)}</td><td>{esc(kst(d.entered_at))}</td>"
        f"<td>{esc(_clip(d.last_error))}</td></tr>" for d in snap.dead_letters)
    return ("<table><thead><tr><th>Provider</th><th class=n>Open</th><th>Oldest (KST)</th>"
            f"</tr></thead><tbody>{groups}</tbody></table>"
            "<h3>Most recent</h3><table><thead><tr><th class=n>Id</th><th class=n>Consent</th>"
            "<th>Provider</th><th>Week</th><th class=n>Attempts</th><th>Entered (KST)</th>"
            f"<th>Last error</th></tr></thead><tbody>{recent}</tbody></table>"
            '<p class="muted">Send them back with <code>mydata-batch requeue</code>.</p>')


def _clip(text: str | None) -> str:
    if not text:
        return "—"
    text = " ".join(text.split())
    return text if len(text) <= ERROR_SHOWN else text[: ERROR_SHOWN - 1] + "…"


def capacity_html(snap: Snapshot) -> str:
    bad = [x for x in snap.loads if x.unplaceable > 0]
    if not bad:
        return ('<p class="muted">Every planned refresh fits its provider\'s windows.</p>'
                if snap.has_plan else '<p class="muted">No plan, so nothing to check.</p>')
    body = "".join(
        f"<tr><td>{esc(x.org_code)}</td><td>{esc(day_label(x.day))}</td>"
        f"<td class=n><span class=bad-text>{esc(num(x.unplaceable))}</span></td>"
        f"<td class=n>{esc(num(x.capacity))}</td><td class=n>{esc(num(x.batch_quota))}</td>"
        "</tr>" for x in bad)
    return ('<p class="bad-text">Planned refreshes that do not fit the provider\'s windows '
            "and rate limit on that day: widen the windows, raise the limit or expect them to "
            "slip.</p>"
            "<table><thead><tr><th>Provider</th><th>Day</th>"
            "<th class=n>Unplaceable, consents</th><th class=n>Capacity, consents</th>"
            "<th class=n>Planned, consents</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def week_links(snap: Snapshot) -> str:
    """Relative links to the weeks around this one (same server, same page)."""
    links = [("← previous", snap.week_start - timedelta(days=7)),
             ("this week", week_start(snap.today)),
             ("next →", snap.week_start + timedelta(days=7))]
    return "<nav>" + " · ".join(
        f'<a href="?week={esc(day.isoformat())}">{esc(label)}</a>' for label, day in links
    ) + "</nav>"


def header(snap: Snapshot, rows: Sequence[Progress], *, refresh_seconds: int | None,
           live: bool = False) -> str:
    end = snap.days[-1]
    week = f"Week {snap.week_start:%Y-%m-%d} (Sun) – {end:%Y-%m-%d} (Sat), KST"
    latest = snap.runs[0] if snap.runs else None
    run = (f"latest run <code>{esc(latest.run_id)}</code> {run_pill(latest, snap.generated_at)}"
           if latest else '<span class="pill">no runs this week</span>')
    alerts = []
    behind = sum(1 for p in rows if p.status is Status.BEHIND)
    if behind:
        alerts.append(f'<span class="pill bad">⚠ {behind} behind plan</span>')
    open_letters = sum(g.count for g in snap.dead_letter_groups)
    if open_letters:
        noun = "dead letter" if open_letters == 1 else "dead letters"
        alerts.append(f'<span class="pill bad">{esc(num(open_letters))} {noun} open</span>')
    unplaceable = sum(x.unplaceable for x in snap.loads)
    if unplaceable:
        alerts.append(f'<span class="pill bad">{esc(num(unplaceable))} unplaceable</span>')
    overdue = {org: n for org in snap.providers if (n := snap.overdue(org))}
    if overdue:
        alerts.append('<span class="pill warn" title="consents not fetched in an earlier week,'
                      ' levelled over this one">overdue: ' + ", ".join(
                          f"{esc(org)} {esc(num(n))}" for org, n in sorted(overdue.items()))
                      + "</span>")
    if snap.config_errors:
        alerts.append(f'<span class="pill bad">⚠ {len(snap.config_errors)} institution '
                      "options refused</span>")
    refresh = f" · refreshes every {refresh_seconds} s" if refresh_seconds else ""
    nav = week_links(snap) if live else ""
    return (f"<header><h1>mydata-batch</h1><span class=week>{esc(week)}</span>{nav}"
            f"<span>{run}</span>{''.join(alerts)}"
            f"<span class=meta>generated {esc(kst(snap.generated_at))} KST{refresh}</span>"
            "</header>")


def empty_notice(snap: Snapshot) -> str:
    """What to do next when there is nothing to show yet."""
    if snap.has_plan:
        return ""
    first = ""
    if not snap.providers:
        first = ("<br>No institutions are loaded yet either: start with "
                 "<code>mydata-batch db init</code>, <code>mydata-batch load institutions "
                 "FILE.toml</code> and <code>mydata-batch load consents FILE.csv</code> (or "
                 "<code>mydata-batch seed</code> for a synthetic population).")
    return (f'<div class="notice"><strong>No plan saved for this week</strong> '
            f"({esc(snap.week_start)} – {esc(snap.days[-1])}). Run "
            "<code>mydata-batch plan --save</code> to plan it, then "
            f"<code>mydata-batch run</code> each night.{first}</div>")


def config_notice(snap: Snapshot) -> str:
    """Institutions whose options the planner would refuse: their calls are a guess."""
    if not snap.config_errors:
        return ""
    items = "".join(f"<li>{esc(e)}</li>" for e in snap.config_errors)
    return (f'<div class="notice"><strong class="bad-text">Institution options the planner '
            f"refuses</strong><ul>{items}</ul>Fix them with <code>mydata-batch load "
            "institutions FILE.toml</code>.</div>")


def render_page(snap: Snapshot, *, refresh_seconds: int | None = None,
                live: bool = False, sections: Sequence[str] = ()) -> str:
    """The whole page; ``refresh_seconds`` adds a meta refresh, ``live`` week links (both
    for the live server; a written file has neither, so it never points anywhere);
    ``sections``: rendered sections appended at the end (run health per minute)."""
    rows = progress(snap)
    focus = ("today" if snap.focus_day == snap.today else "last day of that week"
             if snap.focus_day < snap.today else "first day of that week")
    refresh = (f'<meta http-equiv="refresh" content="{int(refresh_seconds)}">'
               if refresh_seconds else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="referrer" content="no-referrer">',
        refresh,
        f"<title>mydata-batch · week {esc(snap.week_start)}</title>",
        f"<style>{CSS}</style></head><body>",
        header(snap, rows, refresh_seconds=refresh_seconds, live=live),
        "<main>",
        empty_notice(snap),
        config_notice(snap),
    ]
    if snap.providers:
        parts += [
            f'<section id="progress"><h2>Plan vs done, {esc(day_label(snap.focus_day))} '
            f"({esc(focus)})</h2>", progress_table(rows),
            '<p class="muted">Expected by now: the minute plan\'s targets up to this minute. '
            "Behind plan: done trails it by more than 2 % of the day's quota.</p></section>",
        ]
    if snap.has_plan:
        total = day_loads(snap, ALL)
        parts += [
            '<section id="load"><h2>Load per day, all providers</h2>', legend(),
            bar_chart(total, today=snap.today, title="User and batch calls per day, all "
                      "providers", width=900, height=260),
            load_table(total, today=snap.today, table_id="load-all"),
            "<h3>Flatness of user + planned batch, in calls (peak ÷ mean over the week; "
            "1.00 is flat; the same figure as <code>mydata-batch plan</code>'s peak/mean)</h3>",
            flatness_table([flatness(total)]
                           + [flatness(day_loads(snap, org)) for org in snap.providers]),
            "</section>",
            '<section id="providers"><h2>Load per day, per provider</h2>', legend(),
            '<div class="grid">',
        ]
        for org in snap.providers:
            loads = day_loads(snap, org)
            cpc = snap.cpc(org)
            per = "" if cpc is None else f" · {cpc:g} calls per consent"
            parts += [f"<details open><summary>{esc(org)}"
                      f'<span class="muted" style="font-weight:400">{esc(per)}</span>'
                      "</summary>",
                      bar_chart(loads, today=snap.today, title=f"{org}: user and batch calls "
                                "per day"),
                      load_table(loads, today=snap.today, table_id=f"load-{org}"),
                      "</details>"]
        parts += ["</div></section>"]
    parts += [
        '<section id="health"><h2>Run health</h2><h3>Latest runs (counts in consents)</h3>',
        runs_table(snap.runs, snap.generated_at),
        f"<h3>Outcomes on {esc(day_label(snap.focus_day))}, by kind and action</h3>",
        outcomes_table(snap),
        "<h3>Dead letters open</h3>", dead_letters_html(snap),
        "<h3>Capacity problems</h3>", capacity_html(snap), "</section>",
        *sections, "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p)
